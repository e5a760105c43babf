#![allow(unused_variables)]

use dlock::Locker;

#[dlock::locked(locker = locker, name = "order:{order_id}")]
async fn ship(locker: &Locker, order_id: u64) -> u64 {
    order_id
}

fn main() {}
