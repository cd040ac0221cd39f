//! The probe `scripts/test-aarch64.sh` runs first under qemu-user: a thread spawned and joined,
//! a contended mutex and a condition variable, the glibc paths where a dynamically linked
//! aarch64 program was seen to spin forever under qemu-user on another machine (issue 27). It
//! prints "probe ok" and exits 0, or hangs (the script's `timeout` then decides the link mode).
use std::sync::{Arc, Condvar, Mutex};

fn main() {
    let shared = Arc::new((Mutex::new(0u64), Condvar::new()));
    let workers: Vec<_> = (0..4)
        .map(|_| {
            let s = Arc::clone(&shared);
            std::thread::spawn(move || {
                for _ in 0..10_000 {
                    *s.0.lock().unwrap() += 1;
                }
                s.1.notify_all();
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    let n = *shared.0.lock().unwrap();
    assert_eq!(n, 40_000);
    println!("probe ok");
}
