#![allow(unused_variables)]

use dlock::{Error, Locker};

#[dlock::locked(locker = locker, name = "order:{order_id}")]
fn ship(locker: &Locker, order_id: u64) -> Result<(), Error> {
    Ok(())
}

fn main() {}
