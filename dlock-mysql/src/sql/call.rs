//! The shared kinds' busiest calls as stored procedures of the table:
//! an acquire (`<table>_sa1`, the transaction of
//! [`Statements::acquire_shared`]), a waiter's first look
//! (`<table>_se1`, [`Statements::enqueue_shared`]) and a read's or a
//! permit's release (`<table>_sr1`, [`Statements::release_unlocked`]),
//! each doing what its text does and answering the same rows.
//!
//! In a crowd on one name the server's time per grant is what bounds the
//! grants: an acquire's statements run under the name's row lock, and on a
//! small machine every call's parsing takes its share of the same cores.
//! Sent as text, each statement is parsed and planned on every call, its
//! result sent back; a procedure's statements are parsed once per
//! connection and its steps decided on local variables. Measured on one
//! connection with nobody else (2 cores, MariaDB 10.11): an acquire's time
//! under the lock 0.80 ms as text, 0.46 ms as a procedure.
//!
//! `connect` makes the procedures where it may create tables, and
//! `migrate` always; a backend calls them only when `connect` found them
//! all, so a user who may not create routines, or a table made by an older
//! release, keeps the text. A call that finds one gone turns the backend
//! back to the text. The names carry a version: a release that changes a
//! body makes procedures of other names, and never calls an older body.

use dlock_core::Mode;
use sqlx::SqlStr;

use super::shared::{bytes, counts};
use sha2::{Digest, Sha256};

use super::{CLOCK, NOW, Statements, hex, safe};

/// One procedure: its name, the comment that says which body it has, and
/// what follows `CREATE PROCEDURE` in the statement that makes it.
struct Routine {
    name: String,
    comment: String,
    definition: String,
}

/// What follows the table's name in each procedure's: acquire, first
/// look (enqueue), release.
const SUFFIXES: [&str; 3] = ["_sa1", "_se1", "_sr1"];

impl Statements {
    /// The procedure of `suffix`, unquoted (at most 62 characters).
    fn procedure(&self, suffix: &str) -> String {
        format!("{}{suffix}", self.table)
    }

    /// How many of the table's procedures exist in the connection's
    /// database with this release's bodies (the hash in each comment):
    /// one row, the count.
    pub fn procedures_found(&self) -> SqlStr {
        let pairs: Vec<String> = self
            .routines()
            .iter()
            .map(|r| format!("('{}', '{}')", r.name, r.comment))
            .collect();
        safe(format!(
            "SELECT CAST(COUNT(*) AS SIGNED) FROM information_schema.ROUTINES
             WHERE ROUTINE_SCHEMA = DATABASE() AND ROUTINE_TYPE = 'PROCEDURE'
               AND (ROUTINE_NAME, ROUTINE_COMMENT) IN ({})",
            pairs.join(", ")
        ))
    }

    /// The statements that make the procedures, each an error if its
    /// procedure exists (MySQL has no `IF NOT EXISTS` for routines before
    /// 8.0.29).
    pub fn create_procedures(&self) -> Vec<SqlStr> {
        self.routines()
            .into_iter()
            .map(|r| safe(format!("CREATE PROCEDURE {}", r.definition)))
            .collect()
    }

    /// The statements of [`Statements::create_procedures`] as a script for
    /// the `mariadb` or `mysql` command-line client: their bodies hold
    /// `;`, so they go between `DELIMITER` lines (a client command, not
    /// SQL: the script cannot be sent as a query). Each makes its
    /// procedure only if missing (MariaDB 10.1.3, MySQL 8.0.29), so that
    /// the script runs again without error, and without dropping a
    /// procedure that running clients call.
    pub fn procedures_script(&self) -> String {
        let mut script = String::from("DELIMITER //\n");
        for routine in self.routines() {
            script.push_str("CREATE PROCEDURE IF NOT EXISTS ");
            script.push_str(routine.definition.trim());
            script.push_str("\n//\n");
        }
        script.push_str("DELIMITER ;\n");
        script
    }

    /// Whether the table may have procedures: routine names ignore case
    /// where table names (on Linux) do not, so the procedures of `Locks`
    /// would be those of `locks` too. A table named with capitals keeps
    /// the text.
    pub fn may_call(&self) -> bool {
        !self.table.bytes().any(|b| b.is_ascii_uppercase())
    }

    fn routines(&self) -> [Routine; 3] {
        [
            self.create_acquire(),
            self.create_enqueue(),
            self.create_release(),
        ]
    }

    /// The procedure `suffix` taking `params`, running `body`, commented
    /// with a hash of both: a procedure of that name whose comment differs
    /// is not this release's, and is never called.
    fn routine(&self, suffix: &str, params: &str, body: &str) -> Routine {
        let digest = Sha256::digest(format!("{params}\n{body}"));
        let comment = format!("dlock {}", hex(&digest[..8]));
        let name = self.procedure(suffix);
        let definition = format!(
            "`{name}`({params})
             MODIFIES SQL DATA SQL SECURITY INVOKER COMMENT '{comment}'
             {body}"
        );
        Routine {
            name,
            comment,
            definition,
        }
    }

    /// The acquire's procedure.
    fn create_acquire(&self) -> Routine {
        let (t, h) = (&self.table, self.holds());
        let live = format!("name = p_name AND expires_at > {NOW}");
        // The places queued ahead of `p_me` (all of them when it has none).
        let ahead = format!(
            "{live} AND waiting AND owner <> p_me AND {counts}
             AND (v_since IS NULL OR since < v_since OR (since = v_since AND owner < p_me))",
            counts = counts(t, "")
        );
        // Local names never match a column's: in a routine a local
        // variable wins over a column of the same name.
        let params = "p_name VARBINARY(255), p_owner CHAR(32) CHARACTER SET ascii, \
            p_code CHAR(1) CHARACTER SET ascii, p_kind VARCHAR(16) CHARACTER SET ascii, \
            p_permits BIGINT, p_ttl_us BIGINT UNSIGNED, p_holder VARBINARY(255), \
            p_me CHAR(32) CHARACTER SET ascii, p_place_us BIGINT UNSIGNED";
        let body = format!(
            "BEGIN
               DECLARE v_o VARCHAR(32) CHARACTER SET ascii;
               DECLARE v_conflict VARCHAR(16) CHARACTER SET ascii;
               DECLARE v_since, v_fence BIGINT UNSIGNED;
               DECLARE v_held, v_held_w, v_ahead, v_ahead_w BIGINT;
               DECLARE v_admit BOOLEAN;
               SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
               START TRANSACTION;
               INSERT INTO `{t}` (name, owner, version, expires_at, acquired_at, holder)
                 VALUES (p_name, '', {CLOCK}, {NOW}, {NOW}, '')
                 ON DUPLICATE KEY UPDATE version = version;
               SELECT (SELECT IF(expires_at > {NOW}, owner, NULL) FROM `{t}` WHERE name = p_name),
                 (SELECT since FROM {h} WHERE {live} AND waiting AND owner = p_me),
                 COUNT(*), COALESCE(SUM(mode = 'w'), 0)
               INTO v_o, v_since, v_held, v_held_w FROM {h} WHERE {live} AND NOT waiting;
               SELECT MAX(NULLIF(kind, p_kind)), COUNT(*), COALESCE(SUM(mode = 'w'), 0)
               INTO v_conflict, v_ahead, v_ahead_w FROM {h} WHERE {ahead};
               SET v_conflict = COALESCE(IF(v_o LIKE '~%', NULLIF(v_o, p_kind),
                 IF(v_o IS NULL OR v_o = '', NULL, 'x')), v_conflict);
               SET v_admit = v_conflict IS NULL AND CASE p_code
                 WHEN 'w' THEN v_held = 0 AND v_ahead = 0
                 WHEN 'r' THEN v_held_w = 0 AND v_ahead_w = 0
                 ELSE v_held + v_ahead < p_permits END;
               IF v_admit THEN
                 UPDATE `{t}` SET
                   expires_at = IF(owner = p_kind AND expires_at > {NOW},
                     GREATEST(expires_at, {NOW} + INTERVAL p_ttl_us MICROSECOND),
                     {NOW} + INTERVAL p_ttl_us MICROSECOND),
                   owner = p_kind, version = LAST_INSERT_ID(GREATEST(version + 1, {CLOCK})),
                   acquired_at = {NOW}, holder = p_holder
                 WHERE name = p_name;
                 SET v_fence = LAST_INSERT_ID();
                 UPDATE {h} SET expires_at = {NOW}, fence = v_fence
                 WHERE name = p_name AND owner = p_me AND waiting AND v_since IS NOT NULL;
               END IF;
               DELETE FROM {h} WHERE name = p_name AND (
                 (owner = p_me AND waiting AND v_admit AND v_since IS NULL)
                 OR (owner <> p_me AND expires_at < {NOW} - INTERVAL 1 MINUTE));
               IF v_admit OR (p_me <> '' AND v_conflict IS NULL) THEN
                 INSERT INTO {h} (name, owner, mode, kind, fence, expires_at, waiting, since, holder)
                   VALUES (p_name, IF(v_admit, p_owner, p_me), p_code, p_kind, IF(v_admit, v_fence, 0),
                     {NOW} + INTERVAL IF(v_admit, p_ttl_us, p_place_us) MICROSECOND, NOT v_admit,
                     IF(v_admit, 0, {CLOCK}), IF(v_admit, p_holder, ''))
                   ON DUPLICATE KEY UPDATE since = IF(expires_at > {NOW} OR fence > 0, since, {CLOCK}),
                     fence = 0, expires_at = {NOW} + INTERVAL p_place_us MICROSECOND;
               END IF;
               COMMIT;
               SELECT CAST(IF(v_admit, v_fence, NULL) AS SIGNED), CAST(v_conflict AS BINARY),
                 IF(v_admit, NULL, (SELECT CAST(TIMESTAMPDIFF(MICROSECOND, {NOW}, MIN(expires_at))
                   AS SIGNED) FROM {h} WHERE {live} AND NOT waiting));
             END"
        );
        self.routine(SUFFIXES[0], params, &body)
    }

    /// [`Statements::acquire_shared`] as a call of the procedure: the same
    /// values, the same row back.
    #[allow(clippy::too_many_arguments)] // one statement's values
    pub fn call_acquire_shared(
        &self,
        name: &[u8],
        owner: &str,
        mode: Mode,
        ttl_us: u64,
        holder: &str,
        waiter: &str,
        place_us: u64,
    ) -> SqlStr {
        safe(format!(
            "CALL `{}`({}, '{owner}', '{}', '{}', {}, {ttl_us}, {}, '{waiter}', {place_us})",
            self.procedure(SUFFIXES[0]),
            bytes(name),
            mode.code(),
            mode.marker(),
            mode.permits(),
            bytes(holder.as_bytes()),
        ))
    }

    /// A waiter's first look's procedure: its place, committed on its own,
    /// then the acquire's rule read after it.
    fn create_enqueue(&self) -> Routine {
        let (t, h) = (&self.table, self.holds());
        let live = format!("name = p_name AND expires_at > {NOW}");
        let ahead = format!(
            "{live} AND waiting AND owner <> p_me AND {counts}
             AND (since < v_since OR (since = v_since AND owner < p_me))",
            counts = counts(t, "")
        );
        let params = "p_name VARBINARY(255), p_me CHAR(32) CHARACTER SET ascii, \
            p_code CHAR(1) CHARACTER SET ascii, p_kind VARCHAR(16) CHARACTER SET ascii, \
            p_permits BIGINT, p_place_us BIGINT UNSIGNED";
        let body = format!(
            "BEGIN
               DECLARE v_other VARCHAR(32) CHARACTER SET ascii;
               DECLARE v_since BIGINT UNSIGNED;
               DECLARE v_held, v_held_w, v_ahead, v_ahead_w BIGINT;
               DECLARE v_admit BOOLEAN DEFAULT FALSE;
               SET v_other = COALESCE((SELECT IF(owner LIKE '~%', NULLIF(owner, p_kind),
                   IF(owner = '', NULL, 'x')) FROM `{t}` WHERE {live}),
                 (SELECT kind FROM {h} WHERE {live} AND waiting AND mode <> 'x'
                   AND kind <> p_kind LIMIT 1));
               IF v_other IS NULL THEN
                 -- Read committed, so that the insert takes no gap lock.
                 SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
                 INSERT INTO {h} (name, owner, mode, kind, fence, expires_at, waiting, since)
                   VALUES (p_name, p_me, p_code, p_kind, 0,
                     {NOW} + INTERVAL p_place_us MICROSECOND, TRUE, {CLOCK})
                   ON DUPLICATE KEY UPDATE since = IF(expires_at > {NOW} OR fence > 0, since, {CLOCK}),
                     fence = 0, expires_at = {NOW} + INTERVAL p_place_us MICROSECOND;
                 SELECT since INTO v_since FROM {h} WHERE {live} AND waiting AND owner = p_me;
                 SELECT COUNT(*), COALESCE(SUM(mode = 'w'), 0) INTO v_held, v_held_w
                 FROM {h} WHERE {live} AND NOT waiting;
                 SELECT COUNT(*), COALESCE(SUM(mode = 'w'), 0) INTO v_ahead, v_ahead_w
                 FROM {h} WHERE {ahead};
                 SET v_admit = v_since IS NOT NULL AND CASE p_code
                   WHEN 'w' THEN v_held = 0 AND v_ahead = 0
                   WHEN 'r' THEN v_held_w = 0 AND v_ahead_w = 0
                   ELSE v_held + v_ahead < p_permits END;
               END IF;
               SELECT CAST(v_other AS BINARY), CAST(v_admit AS SIGNED),
                 IF(v_admit, NULL, (SELECT CAST(TIMESTAMPDIFF(MICROSECOND, {NOW}, MIN(expires_at))
                   AS SIGNED) FROM {h} WHERE {live} AND NOT waiting));
             END"
        );
        self.routine(SUFFIXES[1], params, &body)
    }

    /// [`Statements::enqueue_shared`] as a call of its procedure.
    pub fn call_enqueue_shared(
        &self,
        name: &[u8],
        mode: Mode,
        waiter: &str,
        place_us: u64,
    ) -> SqlStr {
        safe(format!(
            "CALL `{}`({}, '{waiter}', '{}', '{}', {}, {place_us})",
            self.procedure(SUFFIXES[1]),
            bytes(name),
            mode.code(),
            mode.marker(),
            mode.permits(),
        ))
    }

    /// A read's or a permit's release's procedure.
    fn create_release(&self) -> Routine {
        let h = self.holds();
        let mine =
            format!("name = p_name AND owner = p_owner AND NOT waiting AND expires_at > {NOW}");
        let wake = self.wake_set("p_name", "TRUE", true);
        let answer = self.released("p_name", "v_n", "v_until");
        let params = "p_name VARBINARY(255), p_owner CHAR(32) CHARACTER SET ascii, p_wake BOOLEAN";
        let body = format!(
            "BEGIN
               DECLARE v_granted BIGINT UNSIGNED;
               DECLARE v_from CHAR(32) CHARACTER SET ascii;
               DECLARE v_until DATETIME(6);
               DECLARE v_n BIGINT;
               SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
               START TRANSACTION;
               SELECT COUNT(*), MAX(fence), MAX(expires_at) INTO v_n, v_granted, v_until
               FROM {h} WHERE {mine};
               SET v_from = (SELECT owner FROM {h} WHERE name = p_name AND waiting
                 AND fence = v_granted LIMIT 1);
               DELETE FROM {h} WHERE name = p_name AND owner IN (p_owner, v_from)
                 AND IF(owner = p_owner, NOT waiting, waiting AND fence = v_granted);
               COMMIT;
               IF p_wake AND v_n > 0 THEN
                 {wake}
               END IF;
               {answer};
             END"
        );
        self.routine(SUFFIXES[2], params, &body)
    }

    /// [`Statements::release_unlocked`] as a call of its procedure.
    pub fn call_release_unlocked(&self, name: &[u8], owner: &str, wake: bool) -> SqlStr {
        safe(format!(
            "CALL `{}`({}, '{owner}', {wake})",
            self.procedure(SUFFIXES[2]),
            bytes(name),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A body changed under the same name would never reach a database
    /// that has the old one (its comment would not match: the backend
    /// keeps the text there), so a change of a body takes a new suffix.
    /// When this fails, bump the suffix of the procedure whose body
    /// changed, then pin its new comment here.
    #[test]
    fn a_changed_body_takes_a_new_name() {
        let sql = Statements::new("dlock_locks");
        let pinned: Vec<(String, String)> = sql
            .routines()
            .into_iter()
            .map(|r| (r.name, r.comment))
            .collect();
        let expected = [
            ("dlock_locks_sa1", "dlock 32c5352caf0ed216"),
            ("dlock_locks_se1", "dlock 40581c54e4140704"),
            ("dlock_locks_sr1", "dlock 2468c00dece4a7ae"),
        ];
        let expected: Vec<(String, String)> = expected
            .iter()
            .map(|(n, c)| ((*n).to_owned(), (*c).to_owned()))
            .collect();
        assert_eq!(pinned, expected);
    }

    #[test]
    fn tables_named_with_capitals_keep_the_text() {
        assert!(Statements::new("dlock_locks").may_call());
        assert!(!Statements::new("Dlock_locks").may_call());
    }
}
