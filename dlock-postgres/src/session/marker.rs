//! The kinds' markers: how a hold tells its kind, and how an acquire
//! finds the holds of a conflicting kind without reading `pg_locks`.

use dlock_core::Mode;

/// The marker of a kind of hold: every hold of a name also holds its
/// kind's marker, a shared advisory lock of the two-`int` key space (apart
/// from the names' `bigint` keys), so that an acquire can tell a hold of a
/// conflicting kind by trying a marker, a lookup in the lock manager's
/// table; reading `pg_locks` instead takes every partition of that table
/// and held up every grant and release of the server (a hand-off took
/// 2.7× the bare advisory lock's, against 1.3–1.5× with markers).
pub(crate) fn marker(mode: Mode) -> i32 {
    match mode {
        Mode::Exclusive => 1,
        Mode::Read => 2,
        // Write; core refuses kinds a driver lacks.
        _ => 3,
    }
}

/// The marker `kind` (an SQL integer) of the name whose key is `$2`: the
/// key's halves, the high one told apart by the kind. Another name's
/// marker may be the same (a chance of 2⁻⁶⁴, as for keys): its holds
/// would then conflict with this name's of other kinds.
pub(super) fn marker_key(kind: &str) -> String {
    format!("(($2 >> 32) # {kind})::int, (($2 << 32) >> 32)::int")
}

/// Whether the marker `kind` of the name whose key is `$2` is held by
/// another session: a try of it alone, given back at once. Only under the
/// name's checkers' lock ([`conflicts`]): another look's try would fail
/// it too.
fn marked_by_others(kind: u8) -> String {
    let key = marker_key(&kind.to_string());
    format!(
        "CASE WHEN pg_try_advisory_lock({key}) THEN NOT pg_advisory_unlock({key}) ELSE true END"
    )
}

/// The letters of the held kinds that conflict with the kind whose marker
/// is `mine` (an SQL integer), NULL when none: a mutex's with
/// reader-writer locks, theirs with a mutex. The markers are tried under
/// the name's checkers' lock (marker 4, which no hold takes), held only
/// for the tries, so that two looks never take each other's for a hold;
/// the answer waits in a transaction-local setting while it is given
/// back (`CASE` runs its conditions in order). A `wait`'s look waits for
/// another look to end; a try's answers NULL then.
pub(super) fn conflicts(mine: &str, wait: bool) -> String {
    let checkers = marker_key("4");
    // A refused try does not wait for another look: NULL (held).
    let lock = if wait {
        format!("pg_advisory_lock({checkers})::text <> ''")
    } else {
        format!("NOT pg_try_advisory_lock({checkers})")
    };
    format!(
        "CASE WHEN {lock} THEN NULL \
         WHEN set_config('dlock.conflicts', COALESCE(\
           CASE WHEN {mine} = 1 THEN NULLIF(\
             CASE WHEN {} THEN 'r' ELSE '' END || CASE WHEN {} THEN 'w' ELSE '' END, '') \
           WHEN {} THEN 'm' END, ''), true) IS NULL THEN NULL \
         WHEN NOT pg_advisory_unlock({checkers}) THEN NULL \
         ELSE NULLIF(current_setting('dlock.conflicts'), '') END",
        marked_by_others(2),
        marked_by_others(3),
        marked_by_others(1)
    )
}
