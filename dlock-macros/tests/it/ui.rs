//! Misuse of `#[locked]` fails to compile with a message that says what to
//! do.

#[test]
fn misuse_is_a_clear_compile_error() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/*.rs");
}
