//! The README's tables cannot drift: its case names are exactly those of
//! `suite()` and `fault_suite()`, its mutants exactly the `Bug`s of
//! `tests/it/mutants.rs` (and its count of them right), and each case's
//! "catches" column exactly the mutants that file's `caught!` list says the
//! case catches.

use std::collections::{BTreeMap, BTreeSet};

use dlock_conformance::{fault_suite, suite};

const README: &str = include_str!("../../README.md");
const MUTANTS: &str = include_str!("mutants.rs");

/// A row of a README table: its first cell, and its last.
struct Row<'a> {
    first: &'a str,
    last: &'a str,
}

/// The rows of every README table whose header starts with `| <kind> |`.
fn table_rows(kind: &str) -> Vec<Row<'_>> {
    let header = format!("| {kind} |");
    let mut rows = Vec::new();
    let mut inside = false;
    for line in README.lines() {
        if !line.starts_with('|') {
            inside = false;
        } else if line.starts_with(&header) {
            inside = true;
        } else if inside && !line.starts_with("|---") {
            let cells: Vec<&str> = line.trim_matches('|').split(" | ").collect();
            rows.push(Row {
                first: cells[0].trim(),
                last: cells[cells.len() - 1].trim(),
            });
        }
    }
    rows
}

/// The names in backticks in a cell: `` `a`, `b` `` gives `a` and `b`.
fn quoted(cell: &str) -> Vec<&str> {
    cell.split('`').skip(1).step_by(2).collect()
}

/// The variants of `enum Bug` in tests/it/mutants.rs.
fn bugs() -> Vec<&'static str> {
    let body = MUTANTS
        .split_once("enum Bug {")
        .and_then(|(_, rest)| rest.split_once("\n}"))
        .expect("tests/it/mutants.rs has an `enum Bug { … }`")
        .0;
    body.lines()
        .map(str::trim)
        .filter(|l| !l.starts_with("//") && !l.starts_with('#') && !l.is_empty())
        .map(|l| l.trim_end_matches(','))
        .collect()
}

/// Each `caught!(test, Bug::X, [case, ...]);` of tests/it/mutants.rs: the bug
/// and the cases.
fn caught() -> Vec<(String, Vec<String>)> {
    let mut out = Vec::new();
    let mut rest = MUTANTS;
    // Invocations start a line; the macro's own definition and docs do not.
    while let Some(at) = rest.find("\ncaught!(") {
        let (call, after) = rest[at + "\ncaught!(".len()..]
            .split_once(");")
            .expect("a caught!( … ); invocation");
        rest = after;
        let call: String = call.split_whitespace().collect();
        let (_test, call) = call.split_once(',').expect("caught!(test, …)");
        let (bug, cases) = call.split_once(',').expect("caught!(test, Bug::X, …)");
        let bug = bug.strip_prefix("Bug::").expect("a Bug:: variant");
        let cases = cases.trim_matches(|c| c == '[' || c == ']' || c == ',');
        let cases = cases.split(',').filter(|c| !c.is_empty());
        out.push((bug.to_owned(), cases.map(str::to_owned).collect()));
    }
    out
}

/// Every value that occurs more than once.
fn repeated<'a>(items: impl IntoIterator<Item = &'a str>) -> Vec<&'a str> {
    let mut seen = BTreeSet::new();
    items.into_iter().filter(|i| !seen.insert(*i)).collect()
}

#[test]
fn the_case_tables_list_every_case_and_only_those() {
    let listed: Vec<&str> = table_rows("case")
        .iter()
        .map(|row| *quoted(row.first).first().expect("a case name in backticks"))
        .collect();
    assert_eq!(repeated(listed.iter().copied()), Vec::<&str>::new());
    let listed: BTreeSet<&str> = listed.into_iter().collect();
    let cases: BTreeSet<&str> = suite()
        .iter()
        .map(|c| c.name)
        .chain(fault_suite().iter().map(|c| c.name))
        .collect();
    let missing: Vec<_> = cases.difference(&listed).collect();
    let unknown: Vec<_> = listed.difference(&cases).collect();
    assert!(
        missing.is_empty() && unknown.is_empty(),
        "README.md's case tables miss {missing:?} and list cases that do not exist: {unknown:?}"
    );
}

#[test]
fn the_mutant_table_and_count_match_tests_mutants() {
    let bugs = bugs();
    assert!(bugs.len() > 10, "too few Bug variants parsed: {bugs:?}");
    let listed: Vec<&str> = table_rows("mutant")
        .iter()
        .map(|row| {
            *quoted(row.first)
                .first()
                .expect("a Bug variant in backticks")
        })
        .collect();
    assert_eq!(repeated(listed.iter().copied()), Vec::<&str>::new());
    let listed: BTreeSet<&str> = listed.into_iter().collect();
    let variants: BTreeSet<&str> = bugs.iter().copied().collect();
    let missing: Vec<_> = variants.difference(&listed).collect();
    let unknown: Vec<_> = listed.difference(&variants).collect();
    assert!(
        missing.is_empty() && unknown.is_empty(),
        "README.md's mutant table misses {missing:?} and lists mutants that are not in \
         tests/it/mutants.rs's `enum Bug`: {unknown:?}"
    );
    let count = format!("once with each of {} bugs", bugs.len());
    assert!(
        README
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
            .contains(&count),
        "README.md must say \"{count}\""
    );
}

#[test]
fn each_case_names_the_mutants_it_catches() {
    let caught = caught();
    let tested: Vec<&str> = caught.iter().map(|(bug, _)| bug.as_str()).collect();
    assert_eq!(
        repeated(tested.iter().copied()),
        Vec::<&str>::new(),
        "one caught! per bug"
    );
    let untested: Vec<_> = bugs().into_iter().filter(|b| !tested.contains(b)).collect();
    assert!(untested.is_empty(), "no caught! test for {untested:?}");

    let mut expected: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for (bug, cases) in &caught {
        for case in cases {
            expected.entry(case).or_default().insert(bug);
        }
    }
    for row in table_rows("case") {
        let case = quoted(row.first)[0];
        let bugs: BTreeSet<&str> = quoted(row.last).into_iter().collect();
        let want = expected.remove(case).unwrap_or_default();
        assert_eq!(
            bugs, want,
            "README.md's \"catches\" column for {case} differs from tests/it/mutants.rs"
        );
    }
    assert!(
        expected.is_empty(),
        "tests/it/mutants.rs expects cases the README does not list to catch bugs: {expected:?}"
    );
}
