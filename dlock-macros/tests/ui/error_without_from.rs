#![allow(unused_variables)]

use dlock::Locker;

#[derive(Debug)]
struct MyError;

#[dlock::locked(locker = locker, name = "order:{order_id}")]
async fn ship(locker: &Locker, order_id: u64) -> Result<(), MyError> {
    Ok(())
}

fn main() {}
