//! The campaign's table (Markdown, for the terminal and docs/torture.md), its
//! JSON, and a timeline SVG per run.

use std::fmt::Write as _;

use crate::campaign::Outcome;

/// The table of every run.
pub fn table(outcomes: &[Outcome]) -> String {
    let mut t = String::from(
        "| target | s | grants | faults | exclusion violations (unpredicted) | fencing violations (unpredicted) | stale writes refused (of them sent late on purpose) | longest unavailable after a heal | acquire p50 / p99 | longest call | left held | verdict |\n\
         |---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---|\n",
    );
    for o in outcomes {
        let f = &o.findings;
        let faults = if o.faults.is_empty() {
            "none".to_owned()
        } else {
            o.faults
                .iter()
                .map(|(k, n)| format!("{} {n}", k.label()))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let exclusion = f.exclusion.len() + f.refused_in_belief.len();
        let excl_un = f.unexplained_exclusion();
        let fence_un = f.unexplained_fencing();
        let late = f.refused.iter().filter(|r| r.4).count();
        let verdict = match (o.control_showed, o.passed()) {
            (Some(true), true) => "control: showed its violations",
            (Some(false), _) => "**FAIL: the control showed nothing**",
            (_, true) => "pass",
            (_, false) => "**FAIL**",
        };
        let _ = writeln!(
            t,
            "| {} | {:.0} | {} | {} | {} ({}) | {} ({}) | {} ({}) | {:.2} s | {:.1} / {:.1} ms | {:.2} s | {} | {} |",
            o.target.label,
            o.seconds,
            f.grants,
            faults,
            exclusion,
            excl_un,
            f.fencing.len(),
            fence_un,
            f.refused.len(),
            late,
            f.longest_unavailable_ms / 1e3,
            f.acquire_p50_ms,
            f.acquire_p99_ms,
            f.longest_call_ms / 1e3,
            o.leftovers.len(),
            verdict,
        );
    }
    t
}

/// What failed in a run, one line each: for the terminal.
pub fn failures(o: &Outcome) -> Vec<String> {
    let f = &o.findings;
    let mut lines = Vec::new();
    for x in f.exclusion.iter().filter(|x| x.explained_by.is_none()) {
        lines.push(format!(
            "exclusion: name {} held by client {} (token {}) and client {} (token {}) at once for {:.1} ms",
            x.name, x.first.0, x.first.1, x.second.0, x.second.1, x.overlap_ms
        ));
    }
    for x in f.fencing.iter().filter(|x| x.explained_by.is_none()) {
        lines.push(format!(
            "fencing: name {} granted to client {} with token {}, not above {} granted before it was asked",
            x.name, x.grant.0, x.grant.1, x.earlier
        ));
    }
    for x in f
        .refused_in_belief
        .iter()
        .filter(|x| x.explained_by.is_none())
    {
        lines.push(format!(
            "exclusion: client {} wrote name {} with token {} while it believed it held it, and the resource refused: a higher token was granted meanwhile",
            x.first.0, x.name, x.first.1
        ));
    }
    let bound = o
        .target
        .liveness_bound(std::time::Duration::from_millis(o.ttl_ms + o.lock_delay_ms));
    for gap in &f.unavailable {
        lines.push(format!(
            "liveness: a name not granted for {:.2} s after a heal (bound {:.0} s)",
            gap / 1e3,
            bound.as_secs_f64()
        ));
    }
    for (error, n) in &f.unexpected_errors {
        lines.push(format!("error {n}×: {error}"));
    }
    for kind in &f.ungranted {
        lines.push(format!("never granted: {kind}"));
    }
    for crash in &o.crashed {
        lines.push(crash.clone());
    }
    for (what, took) in &f.slow_calls {
        lines.push(format!("bound: {what} took {:.2} s", took / 1e3));
    }
    for name in &o.leftovers {
        lines.push(format!("left held: {name}"));
    }
    lines
}

/// A timeline: grants per second, the faults drawn as bands.
pub fn svg(o: &Outcome) -> String {
    let (w, h, left, top, bottom) = (1120.0, 260.0, 50.0, 30.0, 40.0);
    let secs = o.seconds.ceil().max(1.0) as usize;
    let mut bins = vec![0usize; secs];
    for &t in &o.grant_times {
        let s = (t.saturating_sub(o.started_ns) / 1_000_000_000) as usize;
        if let Some(b) = bins.get_mut(s) {
            *b += 1;
        }
    }
    let peak = bins.iter().copied().max().unwrap_or(0).max(1) as f64;
    let x = |s: f64| left + (w - left - 10.0) * s / secs as f64;
    let y = |n: f64| h - bottom - (h - bottom - top) * n / peak;
    let mut out = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"11\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"{left}\" y=\"18\" font-size=\"13\">{} — grants per second, faults as bands (seed {})</text>\n",
        escape(o.target.label),
        o.seed
    );
    for f in &o.nemesis.faults {
        let s0 = f.start.saturating_sub(o.started_ns) as f64 / 1e9;
        let s1 = f.end.saturating_sub(o.started_ns) as f64 / 1e9;
        let (x0, x1) = (x(s0), x(s1).max(x(s0) + 1.0));
        let _ = writeln!(
            out,
            "<rect x=\"{x0:.1}\" y=\"{top}\" width=\"{:.1}\" height=\"{:.1}\" fill=\"{}\" opacity=\"0.3\"><title>{}</title></rect>",
            x1 - x0,
            h - bottom - top,
            colour(f.kind),
            f.kind.label()
        );
    }
    let points: Vec<String> = bins
        .iter()
        .enumerate()
        .map(|(s, &n)| format!("{:.1},{:.1}", x(s as f64 + 0.5), y(n as f64)))
        .collect();
    let _ = writeln!(
        out,
        "<polyline fill=\"none\" stroke=\"black\" stroke-width=\"1.5\" points=\"{}\"/>",
        points.join(" ")
    );
    let base = h - bottom;
    let _ = writeln!(
        out,
        "<line x1=\"{left}\" y1=\"{base}\" x2=\"{}\" y2=\"{base}\" stroke=\"black\"/>\n\
         <text x=\"{left}\" y=\"{}\">0 s</text><text x=\"{}\" y=\"{}\" text-anchor=\"end\">{secs} s</text>\n\
         <text x=\"{}\" y=\"{}\" text-anchor=\"end\">{peak:.0}/s</text>",
        w - 10.0,
        base + 14.0,
        w - 10.0,
        base + 14.0,
        left - 4.0,
        top + 10.0
    );
    let mut lx = left;
    for kind in crate::target::FaultKind::ALL {
        let _ = writeln!(
            out,
            "<rect x=\"{lx}\" y=\"{}\" width=\"10\" height=\"10\" fill=\"{}\" opacity=\"0.5\"/><text x=\"{}\" y=\"{}\">{}</text>",
            h - 16.0,
            colour(kind),
            lx + 13.0,
            h - 7.0,
            kind.label()
        );
        lx += 95.0;
    }
    out.push_str("</svg>\n");
    out
}

fn colour(kind: crate::target::FaultKind) -> &'static str {
    use crate::target::FaultKind as K;
    match kind {
        K::LinkDelay => "#f2c14e",
        K::LinkStall => "#f78154",
        K::LinkCut => "#d1495b",
        K::ServerPause => "#5fad56",
        K::ServerKill => "#4d9de0",
        K::ClientStop => "#9b5de5",
        K::ClientKill => "#555555",
        K::NodePause => "#2a9d8f",
        K::NodePartition => "#e76f51",
        K::NodeKill => "#264653",
        K::ClockStep => "#000000",
    }
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}
