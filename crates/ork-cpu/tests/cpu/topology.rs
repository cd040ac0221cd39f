//! The core choice on fake sysfs trees shaped like an RK3588, an RK3576 (frequencies only) and
//! a uniform x86 box.

use std::path::Path;

use ork_cpu::topology::{format_cpu_list, parse_cpu_list};
use ork_cpu::{CoreSource, CpuError, CpuOptions, Topology};

/// Write `cpuN/cpu_capacity` and `cpuN/cpufreq/cpuinfo_max_freq` for each `(capacity, khz)`.
fn tree(dir: &Path, online: Option<&str>, cores: &[(Option<u64>, Option<u64>)]) {
    if let Some(o) = online {
        std::fs::write(dir.join("online"), format!("{o}\n")).unwrap();
    }
    for (i, (cap, khz)) in cores.iter().enumerate() {
        let c = dir.join(format!("cpu{i}"));
        std::fs::create_dir_all(c.join("cpufreq")).unwrap();
        if let Some(cap) = cap {
            std::fs::write(c.join("cpu_capacity"), format!("{cap}\n")).unwrap();
        }
        if let Some(khz) = khz {
            std::fs::write(c.join("cpufreq/cpuinfo_max_freq"), format!("{khz}\n")).unwrap();
        }
    }
    // Other entries of the real directory that are not CPUs.
    std::fs::create_dir_all(dir.join("cpufreq")).unwrap();
    std::fs::create_dir_all(dir.join("cpuidle")).unwrap();
}

const ALL8: [usize; 8] = [0, 1, 2, 3, 4, 5, 6, 7];

fn rk3588(dir: &Path) -> Topology {
    let little = (Some(414), Some(1_800_000));
    let big = (Some(1024), Some(2_256_000));
    tree(
        dir,
        Some("0-7"),
        &[little, little, little, little, big, big, big, big],
    );
    Topology::read(dir)
}

#[test]
fn rk3588_runs_on_the_four_big_cores() {
    let dir = tempfile::tempdir().unwrap();
    let topo = rk3588(dir.path());
    assert_eq!(topo.cores.len(), 8);
    assert_eq!(topo.cores[0].capacity, Some(414));
    assert_eq!(topo.cores[7].max_freq_khz, Some(2_256_000));
    let c = topo.choose(&ALL8, &CpuOptions::default()).unwrap();
    assert_eq!(c.cores, [4, 5, 6, 7]);
    assert_eq!(c.threads, 4);
    assert_eq!(c.source, CoreSource::BigByCapacity);
    // taskset 5-6: the big cores the process may use.
    let c = topo.choose(&[5, 6], &CpuOptions::default()).unwrap();
    assert_eq!((c.cores.as_slice(), c.threads), (&[5, 6][..], 2));
    // taskset 0-3: only little cores, which are then all alike.
    let c = topo.choose(&[0, 1, 2, 3], &CpuOptions::default()).unwrap();
    assert_eq!(
        (c.cores.as_slice(), c.source),
        (&[0, 1, 2, 3][..], CoreSource::All)
    );
}

#[test]
fn threads_and_a_core_list_override() {
    let dir = tempfile::tempdir().unwrap();
    let topo = rk3588(dir.path());
    let opts = CpuOptions {
        threads: Some(2),
        cpus: None,
        ..CpuOptions::default()
    };
    let c = topo.choose(&ALL8, &opts).unwrap();
    assert_eq!((c.cores.as_slice(), c.threads), (&[4, 5, 6, 7][..], 2));
    let opts = CpuOptions {
        threads: None,
        cpus: Some(vec![7, 0, 7]),
        ..CpuOptions::default()
    };
    let c = topo.choose(&ALL8, &opts).unwrap();
    assert_eq!(
        (c.cores.as_slice(), c.threads, c.source),
        (&[0, 7][..], 2, CoreSource::List)
    );
    for (cpus, threads) in [(Some(vec![8]), None), (Some(vec![]), None), (None, Some(0))] {
        let opts = CpuOptions {
            threads,
            cpus,
            ..CpuOptions::default()
        };
        assert!(matches!(
            topo.choose(&ALL8, &opts),
            Err(CpuError::Threads { .. })
        ));
    }
    // A core outside the affinity mask.
    let opts = CpuOptions {
        threads: None,
        cpus: Some(vec![1]),
        ..CpuOptions::default()
    };
    assert!(matches!(
        topo.choose(&[4, 5], &opts),
        Err(CpuError::Threads { .. })
    ));
}

#[test]
fn rk3576_without_capacities_uses_the_fastest_clock() {
    let dir = tempfile::tempdir().unwrap();
    let a = (None, Some(2_016_000));
    let b = (None, Some(2_208_000));
    tree(dir.path(), Some("0-7"), &[a, a, a, a, b, b, b, b]);
    let c = Topology::read(dir.path())
        .choose(&ALL8, &CpuOptions::default())
        .unwrap();
    assert_eq!(
        (c.cores.as_slice(), c.source),
        (&[4, 5, 6, 7][..], CoreSource::BigByFrequency)
    );
}

#[test]
fn a_uniform_box_uses_every_core() {
    let dir = tempfile::tempdir().unwrap();
    let x = (None, Some(3_500_000));
    tree(dir.path(), Some("0-3"), &[x, x, x, x]);
    let c = Topology::read(dir.path())
        .choose(&ALL8, &CpuOptions::default())
        .unwrap();
    assert_eq!(
        (c.cores.as_slice(), c.source),
        (&[0, 1, 2, 3][..], CoreSource::All)
    );
    // No `online` file: the cpuN directories; no cpufreq either: every core.
    let dir = tempfile::tempdir().unwrap();
    tree(dir.path(), None, &[(None, None), (None, None)]);
    let topo = Topology::read(dir.path());
    assert_eq!(topo.cores.iter().map(|c| c.id).collect::<Vec<_>>(), [0, 1]);
    let c = topo.choose(&[0, 1], &CpuOptions::default()).unwrap();
    assert_eq!(c.cores, [0, 1]);
    // An empty tree (a sandbox without sysfs): the affinity mask alone.
    let dir = tempfile::tempdir().unwrap();
    let c = Topology::read(dir.path())
        .choose(&[0, 1, 2], &CpuOptions::default())
        .unwrap();
    assert_eq!(c.cores, [0, 1, 2]);
}

#[test]
fn cpu_lists_parse_and_print() {
    assert_eq!(parse_cpu_list("4-7").unwrap(), [4, 5, 6, 7]);
    assert_eq!(parse_cpu_list("0,2,4-5\n").unwrap(), [0, 2, 4, 5]);
    assert_eq!(parse_cpu_list("3,1,1").unwrap(), [1, 3]);
    for bad in ["", "a", "3-1", "1,,2", "-1", "0-", "99999"] {
        assert!(parse_cpu_list(bad).is_err(), "{bad:?}");
    }
    assert_eq!(format_cpu_list(&[0, 1, 2, 3, 6, 8, 9]), "0-3,6,8-9");
    assert_eq!(format_cpu_list(&[5]), "5");
}

#[test]
fn this_machine_gives_a_usable_pool() {
    let pool = ork_cpu::CpuPool::new(&CpuOptions {
        threads: Some(2),
        cpus: None,
        ..CpuOptions::default()
    })
    .unwrap();
    assert_eq!(pool.threads(), 2);
    // Every task runs exactly once, whatever the interleaving.
    let hits: Vec<std::sync::atomic::AtomicU32> = (0..1000).map(|_| Default::default()).collect();
    pool.run(hits.len(), |i| {
        hits[i].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    });
    assert!(hits
        .iter()
        .all(|h| h.load(std::sync::atomic::Ordering::Relaxed) == 1));
}
