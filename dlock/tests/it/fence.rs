//! The resource's side of fencing, on each store with a helper: a holder
//! that stopped renewing (as a paused process does) writes after its
//! lease ended and the next holder wrote; the fenced write is refused and
//! the next holder's data stands. The control, the same stale write
//! without the helper, overwrites it: the lost update the fence prevents.

use std::time::Duration;

use dlock::postgres::fence::PgFence;
use dlock::redis::fence::RedisFence;
use dlock::redis::redis::{self, AsyncCommands};
use dlock::{Error, Guard, LockOptions, Locker};
use dlock_conformance::harness::{Service, shared};

use crate::locker;

/// A stale holder and the holder after it: `old` stopped renewing, its
/// lease ended, and `new` was granted the name (with a greater token).
async fn stale_and_next(service: Service, name: &str) -> (Guard, Guard, Locker, Locker) {
    let (a, b) = (locker(service).await, locker(service).await);
    let paused = LockOptions::new().ttl(Duration::from_secs(1)).renew(false);
    let old = a.acquire(name, &paused).await.expect("the first holder");
    let wait = LockOptions::new().wait(Duration::from_secs(30));
    let new = b
        .acquire(name, &wait)
        .await
        .expect("granted once the lease ended");
    assert!(new.fencing_token() > old.fencing_token());
    (old, new, a, b)
}

fn refused<T: std::fmt::Debug>(r: dlock::Result<T>, old: &Guard, new: &Guard) {
    assert!(
        matches!(&r, Err(Error::Fenced { token, highest, .. })
            if *token == old.fencing_token() && *highest == new.fencing_token()),
        "the stale write: {r:?}"
    );
}

/// `sql_fence_test!(test, Service, Pool, Fence, upsert)`: the case on a SQL
/// store, its data written by `upsert` (`$data` for the table, one
/// parameter for the value). The stale holder's transaction reads before
/// the next holder writes (under REPEATABLE READ its snapshot dates from
/// then), and is refused all the same.
macro_rules! sql_fence_test {
    ($test:ident, $service:expr, $pool:ty, $fence:ty, $upsert:literal) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $test() {
            let url = shared($service).await.url();
            let pool = <$pool>::connect(url).await.expect("connect");
            let tag = format!("{:08x}", fastrand::u32(..));
            let data = format!("fence_data_{tag}");
            let fence = <$fence>::new(&format!("fence_{tag}")).expect("a table name");
            fence
                .create_table(&mut pool.acquire().await.expect("conn"))
                .await
                .expect("create the fence table");
            let create = format!("CREATE TABLE {data} (id INT PRIMARY KEY, value TEXT NOT NULL)");
            sqlx::raw_sql(sqlx::AssertSqlSafe(create))
                .execute(&pool)
                .await
                .expect("create");
            let set = $upsert.replace("$data", &data);
            let read = format!("SELECT value FROM {data} WHERE id = 1");
            let write = |who: &'static str, token: Option<u64>| {
                let (pool, fence, set) = (pool.clone(), fence.clone(), set.clone());
                async move {
                    let mut tx = pool.begin().await.expect("begin");
                    if let Some(token) = token {
                        fence.admit(&mut tx, "row:1", token).await?;
                    }
                    sqlx::query(sqlx::AssertSqlSafe(set))
                        .bind(who)
                        .execute(&mut *tx)
                        .await
                        .expect("write");
                    tx.commit().await.expect("commit");
                    Ok::<_, Error>(())
                }
            };
            let value = || async {
                sqlx::query_scalar::<_, String>(sqlx::AssertSqlSafe(read.clone()))
                    .fetch_one(&pool)
                    .await
                    .expect("read")
            };
            let (old, new, _a, _b) = stale_and_next($service, &format!("fence-{tag}")).await;
            write("first", Some(old.fencing_token()))
                .await
                .expect("the first holder's write");
            let mut stale = pool.begin().await.expect("begin");
            let seen: String = sqlx::query_scalar(sqlx::AssertSqlSafe(read.clone()))
                .fetch_one(&mut *stale)
                .await
                .expect("read");
            assert_eq!(seen, "first");
            write("new", Some(new.fencing_token()))
                .await
                .expect("the holder's write");
            refused(
                fence.admit(&mut stale, "row:1", old.fencing_token()).await,
                &old,
                &new,
            );
            drop(stale);
            refused(write("old", Some(old.fencing_token())).await, &old, &new);
            assert_eq!(value().await, "new");
            // The control: the same write without the fence loses the update.
            write("old", None).await.expect("an unfenced write");
            assert_eq!(value().await, "old");
        }
    };
}

sql_fence_test!(
    postgres_refuses_a_stale_holders_write,
    Service::Postgres,
    sqlx::PgPool,
    PgFence,
    "INSERT INTO $data VALUES (1, $1) ON CONFLICT (id) DO UPDATE SET value = $1"
);
sql_fence_test!(
    mariadb_refuses_a_stale_holders_write,
    Service::MariaDb,
    sqlx::MySqlPool,
    dlock::mysql::fence::MySqlFence,
    "REPLACE INTO $data VALUES (1, ?)"
);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_refuses_a_stale_holders_write() {
    let url = shared(Service::Redis).await.url();
    let client = redis::Client::open(url).expect("a URL");
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    let tag = format!("{:08x}", fastrand::u32(..));
    let key = format!("fence-data-{tag}");
    let fence = RedisFence::new();
    let (old, new, _a, _b) = stale_and_next(Service::Redis, &format!("fence-redis-{tag}")).await;
    fence
        .set(&mut conn, &key, b"new", new.fencing_token())
        .await
        .expect("the holder's write");
    refused(
        fence
            .set(&mut conn, &key, b"old", old.fencing_token())
            .await,
        &old,
        &new,
    );
    let value: String = conn.get(&key).await.expect("read");
    assert_eq!(value, "new");
    let hash = format!("{key}-hash");
    fence
        .hset(&mut conn, &hash, "f", b"new", new.fencing_token())
        .await
        .expect("the holder's hash write");
    refused(
        fence
            .hset(&mut conn, &hash, "f", b"old", old.fencing_token())
            .await,
        &old,
        &new,
    );
    let _: () = conn.set(&key, "old").await.expect("an unfenced write");
    let value: String = conn.get(&key).await.expect("read");
    assert_eq!(value, "old");
}
