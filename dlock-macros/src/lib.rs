#![doc = include_str!("../README.md")]

use proc_macro::TokenStream;
use proc_macro2::{Span, TokenStream as TokenStream2};
use quote::{ToTokens, quote, quote_spanned};
use syn::parse::Parser;
use syn::punctuated::Punctuated;
use syn::spanned::Spanned;
use syn::{Expr, FnArg, Ident, ItemFn, LitStr, Meta, Pat, ReturnType, Token, Type};

/// Runs an async fn's body while holding a distributed lock named by its
/// arguments: acquire, run, release.
///
/// ```ignore
/// #[dlock::locked(locker = self.locker, name = "order:{order_id}", wait = "5s", ttl = "30s")]
/// async fn ship(&self, order_id: u64) -> Result<(), ShipError> {
///     // runs on one node at a time per order id
/// }
/// ```
///
/// Settings:
///
/// | key | value | default |
/// |---|---|---|
/// | `locker` | an expression giving a `dlock::Locker` (or a reference to one): `self.locker`, a static, an argument | required |
/// | `name` | a string template; `{arg}` or `{arg.field}` puts an argument (`Display`) in, `{{` and `}}` are braces | required |
/// | `wait` | how long to wait for the lock, as `"5s"`, `"250ms"`, `"1m 30s"`; `"0s"` makes one attempt | no bound |
/// | `ttl` | the lease time (renewed in the background while the body runs) | 30 s |
/// | `guard` | a name under which the body sees the `&dlock::Guard` (for its fencing token) | none |
/// | `mode` | `"read"` or `"write"`: a side of the name's reader-writer lock instead of a mutex | a mutex |
/// | `permits` | a number N ≥ 1: one of N permits of the name's semaphore (at most N bodies at once) | a mutex |
///
/// The fn must return `Result<T, E>` with `E: From<dlock::Error>`. The body
/// runs only under a valid lease; an error to lock returns
/// `Err(dlock::Error)` converted to `E` (`Timeout` when the wait passed). If
/// the lease is lost before the body finishes, the body is cancelled (dropped
/// at its next `.await`, as with `Locker::with_lock`) and the result is
/// `Err(dlock::Error::NotHeld)` converted: another node may have run the same
/// work meanwhile, which is why writes should carry the fencing token. A
/// failed release after the body is logged, and the body's result returned.
#[proc_macro_attribute]
pub fn locked(attr: TokenStream, item: TokenStream) -> TokenStream {
    let item = TokenStream2::from(item);
    match expand(attr.into(), item.clone()) {
        Ok(tokens) => tokens.into(),
        // The fn as written stays, so that the error is the only one.
        Err(e) => {
            let mut out = e.to_compile_error();
            out.extend(item);
            out.into()
        }
    }
}

/// The attribute's settings.
struct Settings {
    locker: Expr,
    name: LitStr,
    wait: Option<(std::time::Duration, Span)>,
    ttl: Option<(std::time::Duration, Span)>,
    guard: Option<Ident>,
    /// `.read()`, `.write()` or `.permits(n)` on the options.
    mode: Option<TokenStream2>,
}

const KEYS: &str = "keys: locker, name, wait, ttl, guard, mode, permits";

fn parse_settings(attr: TokenStream2) -> syn::Result<Settings> {
    let metas = Punctuated::<Meta, Token![,]>::parse_terminated.parse2(attr)?;
    let (mut locker, mut name, mut wait, mut ttl, mut guard) = (None, None, None, None, None);
    let mut mode: Option<TokenStream2> = None;
    let mut set_mode = |span: Span, tokens: TokenStream2| {
        if mode.replace(tokens).is_some() {
            return Err(syn::Error::new(
                span,
                "`mode` and `permits` exclude each other, and each is given once",
            ));
        }
        Ok(())
    };
    for meta in metas {
        let Meta::NameValue(nv) = meta else {
            return Err(syn::Error::new(
                meta.span(),
                format!("expected `key = value`; {KEYS}"),
            ));
        };
        let key = nv
            .path
            .get_ident()
            .map(Ident::to_string)
            .unwrap_or_default();
        let value = nv.value;
        match key.as_str() {
            "locker" => locker = Some(value),
            "name" => name = Some(string(&value, "name")?),
            "wait" => wait = Some(duration(&value, "wait")?),
            "ttl" => ttl = Some(duration(&value, "ttl")?),
            "mode" => {
                let text = string(&value, "mode")?;
                let tokens = match text.value().as_str() {
                    "read" => quote_spanned!(text.span()=> .read()),
                    "write" => quote_spanned!(text.span()=> .write()),
                    _ => {
                        return Err(syn::Error::new(
                            text.span(),
                            "`mode` is \"read\" or \"write\"",
                        ));
                    }
                };
                set_mode(text.span(), tokens)?;
            }
            "permits" => {
                let permits = match &value {
                    Expr::Lit(syn::ExprLit {
                        lit: syn::Lit::Int(n),
                        ..
                    }) => n.base10_parse::<u32>().ok().filter(|&n| n > 0),
                    _ => None,
                }
                .ok_or_else(|| {
                    syn::Error::new(value.span(), "`permits` takes a whole number from 1")
                })?;
                set_mode(value.span(), quote!(.permits(#permits)))?;
            }
            "guard" => match &value {
                Expr::Path(p) if p.path.get_ident().is_some() => {
                    guard = p.path.get_ident().cloned();
                }
                _ => return Err(syn::Error::new(value.span(), "`guard` takes a plain name")),
            },
            _ => {
                return Err(syn::Error::new(
                    nv.path.span(),
                    format!("unknown setting; {KEYS}"),
                ));
            }
        }
    }
    let missing =
        |key: &str| syn::Error::new(Span::call_site(), format!("#[locked] needs `{key} = ...`"));
    Ok(Settings {
        locker: locker.ok_or_else(|| missing("locker"))?,
        name: name.ok_or_else(|| missing("name"))?,
        wait,
        ttl,
        guard,
        mode,
    })
}

fn string(value: &Expr, key: &str) -> syn::Result<LitStr> {
    match value {
        Expr::Lit(syn::ExprLit {
            lit: syn::Lit::Str(s),
            ..
        }) => Ok(s.clone()),
        _ => Err(syn::Error::new(
            value.span(),
            format!("`{key}` takes a string literal"),
        )),
    }
}

fn duration(value: &Expr, key: &str) -> syn::Result<(std::time::Duration, Span)> {
    let text = string(value, key)?;
    humantime::parse_duration(&text.value())
        .map(|d| (d, text.span()))
        .map_err(|e| {
            syn::Error::new(
                text.span(),
                format!("`{key}`: {e}; write a duration such as \"5s\", \"250ms\" or \"1m 30s\""),
            )
        })
}

/// A lock name template, split into a `format!` string with positional
/// `{}` holes and the expressions that fill them.
struct Template {
    format: String,
    args: Vec<TokenStream2>,
}

/// Parses `template`: each `{path}` or `{path:spec}` becomes a hole filled
/// by `path` (`arg` or `arg.field.field`), whose first part must be one of
/// `params`.
fn parse_template(template: &str, params: &[String], span: Span) -> syn::Result<Template> {
    let mut format = String::new();
    let mut args = Vec::new();
    let mut chars = template.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '{' if chars.peek() == Some(&'{') => {
                chars.next();
                format.push_str("{{");
            }
            '}' if chars.peek() == Some(&'}') => {
                chars.next();
                format.push_str("}}");
            }
            '{' => {
                let mut hole = String::new();
                loop {
                    match chars.next() {
                        Some('}') => break,
                        Some(c) => hole.push(c),
                        None => {
                            return Err(syn::Error::new(span, "unclosed `{` in the lock name"));
                        }
                    }
                }
                let (path, spec) = match hole.split_once(':') {
                    Some((path, spec)) => (path.trim(), Some(spec)),
                    None => (hole.trim(), None),
                };
                let mut parts = path.split('.');
                let first = parts.next().unwrap_or_default();
                if !params.iter().any(|p| p == first) {
                    let known = if params.is_empty() {
                        "the function has no arguments".to_owned()
                    } else {
                        format!("its arguments are: {}", params.join(", "))
                    };
                    return Err(syn::Error::new(
                        span,
                        format!(
                            "`{{{path}}}` in the lock name is not an argument of this function; {known}"
                        ),
                    ));
                }
                let mut expr = ident(first, span)?.into_token_stream();
                for field in parts {
                    let member: syn::Member = syn::parse_str(field).map_err(|_| {
                        syn::Error::new(
                            span,
                            format!("`{field}` in `{{{path}}}` is not a field name"),
                        )
                    })?;
                    expr = quote!(#expr.#member);
                }
                format.push('{');
                if let Some(spec) = spec {
                    format.push(':');
                    format.push_str(spec);
                }
                format.push('}');
                args.push(expr);
            }
            '}' => {
                return Err(syn::Error::new(
                    span,
                    "unmatched `}` in the lock name; write `}}`",
                ));
            }
            c => format.push(c),
        }
    }
    Ok(Template { format, args })
}

fn ident(name: &str, span: Span) -> syn::Result<TokenStream2> {
    if name == "self" {
        return Ok(quote_spanned!(span=> self));
    }
    syn::parse_str::<Ident>(name)
        .map(|mut i| {
            i.set_span(span);
            i.into_token_stream()
        })
        .map_err(|_| syn::Error::new(span, format!("`{name}` is not an argument name")))
}

/// The names the template may use: `self` and every argument bound to a
/// plain identifier.
fn param_names(f: &ItemFn) -> Vec<String> {
    f.sig
        .inputs
        .iter()
        .filter_map(|arg| match arg {
            FnArg::Receiver(_) => Some("self".to_owned()),
            FnArg::Typed(t) => match &*t.pat {
                Pat::Ident(p) => Some(p.ident.to_string()),
                _ => None,
            },
        })
        .collect()
}

/// The return type, if it is a `Result` (by the last segment of its
/// path, so that aliases such as `io::Result` and `anyhow::Result` count).
fn result_type(ret: &ReturnType) -> Option<Box<Type>> {
    let ReturnType::Type(_, ty) = ret else {
        return None;
    };
    let Type::Path(p) = &**ty else {
        return None;
    };
    p.path
        .segments
        .last()
        .is_some_and(|s| s.ident == "Result")
        .then(|| ty.clone())
}

fn duration_tokens(d: std::time::Duration, span: Span) -> TokenStream2 {
    let (secs, nanos) = (d.as_secs(), d.subsec_nanos());
    quote_spanned!(span=> ::std::time::Duration::new(#secs, #nanos))
}

fn expand(attr: TokenStream2, item: TokenStream2) -> syn::Result<TokenStream2> {
    let settings = parse_settings(attr)?;
    let mut f: ItemFn = syn::parse2(item)?;
    if f.sig.asyncness.is_none() {
        return Err(syn::Error::new(
            f.sig.fn_token.span(),
            "#[locked] works on `async fn` only: the lock is taken and released with `.await`",
        ));
    }
    let Some(ret) = result_type(&f.sig.output) else {
        // The fn's name alone: a span joined with its return type would
        // depend on the toolchain (`Span::join` is new on stable).
        return Err(syn::Error::new(
            f.sig.ident.span(),
            "#[locked] needs a fn returning `Result<T, E>` where `E: From<dlock::Error>`, so that a lock error can be returned",
        ));
    };
    let template = parse_template(
        &settings.name.value(),
        &param_names(&f),
        settings.name.span(),
    )?;
    let format = LitStr::new(&template.format, settings.name.span());
    let args = &template.args;
    let locker = &settings.locker;
    let mut options = quote!(::dlock::LockOptions::new());
    if let Some((ttl, span)) = settings.ttl {
        let ttl = duration_tokens(ttl, span);
        options = quote!(#options.ttl(#ttl));
    }
    if let Some((wait, span)) = settings.wait {
        let wait = duration_tokens(wait, span);
        options = quote!(#options.wait(#wait));
    }
    if let Some(mode) = &settings.mode {
        options = quote!(#options #mode);
    }
    let guard_binding = settings
        .guard
        .map(|g| quote!(let #g: &::dlock::Guard = &__dlock_guard;));
    let body = &f.block;
    let new_body = quote! {{
        let __dlock_name = ::std::format!(#format #(, #args)*);
        let __dlock_options = #options;
        let __dlock_guard = match (&#locker).acquire(&__dlock_name, &__dlock_options).await {
            ::std::result::Result::Ok(__dlock_acquired) => __dlock_acquired,
            ::std::result::Result::Err(__dlock_error) => {
                return ::std::result::Result::Err(::std::convert::From::from(__dlock_error));
            }
        };
        // The rule of every body under a lock: it starts only under a
        // valid lease and is cancelled the moment the lease is lost.
        let __dlock_result: #ret = match __dlock_guard
            .while_held(async {
                #guard_binding
                #body
            })
            .await
        {
            ::std::result::Result::Ok(__dlock_value) => __dlock_value,
            ::std::result::Result::Err(__dlock_error) => {
                return ::std::result::Result::Err(::std::convert::From::from(__dlock_error));
            }
        };
        match __dlock_guard.release().await {
            // Released, or already ended after the body finished.
            ::std::result::Result::Ok(()) | ::std::result::Result::Err(::dlock::Error::NotHeld { .. }) => {}
            // The body ran; the lease ends with its TTL or session.
            ::std::result::Result::Err(__dlock_error) => {
                ::dlock::__private::release_failed(&__dlock_name, &__dlock_error);
            }
        }
        __dlock_result
    }};
    f.block = syn::parse2(new_body)?;
    Ok(f.into_token_stream())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn holes(template: &str, params: &[&str]) -> Result<(String, Vec<String>), String> {
        let params: Vec<String> = params.iter().map(|p| (*p).to_owned()).collect();
        parse_template(template, &params, Span::call_site())
            .map(|t| {
                let args = t.args.iter().map(|a| a.to_string()).collect();
                (t.format, args)
            })
            .map_err(|e| e.to_string())
    }

    #[test]
    fn templates_become_positional_holes() {
        assert_eq!(
            holes("order:{order_id}", &["order_id"]),
            Ok(("order:{}".to_owned(), vec!["order_id".to_owned()]))
        );
        assert_eq!(
            holes("{user.id}/{n:04}", &["user", "n"]),
            Ok((
                "{}/{:04}".to_owned(),
                vec!["user . id".to_owned(), "n".to_owned()]
            ))
        );
        assert_eq!(
            holes("{{literal}} {self.0}", &["self"]),
            Ok(("{{literal}} {}".to_owned(), vec!["self . 0".to_owned()]))
        );
    }

    #[test]
    fn bad_templates_say_why() {
        let e = holes("order:{id}", &["order_id"]).unwrap_err();
        assert!(
            e.contains("not an argument") && e.contains("order_id"),
            "{e}"
        );
        assert!(holes("a{b", &["b"]).unwrap_err().contains("unclosed"));
        assert!(holes("a}b", &[]).unwrap_err().contains("unmatched"));
        assert!(holes("{x.}", &["x"]).unwrap_err().contains("not a field"));
    }
}
