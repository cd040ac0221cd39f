//! Which cores the CPU engine runs on: read from sysfs, big cores first on big.LITTLE chips.
//!
//! Linux describes each logical CPU under `/sys/devices/system/cpu/cpuN/`: `cpu_capacity`
//! (arm64 with a capacity table in the device tree: the fastest core is 1024, an RK3588's
//! Cortex-A55s 414 beside its A76s at 1024) and `cpufreq/cpuinfo_max_freq` (kHz). `online` lists
//! the CPUs that are up (`0-7`). Decode on an RK3588 is fastest on the four A76 cores alone
//! (what owners do with `taskset 4-7`: the A55s read memory at a fraction of the rate, and a
//! matmul split evenly waits for its slowest worker), so by default the engine runs on the cores
//! of the highest capacity (or, without capacities, the highest maximum frequency). A chip whose
//! cores are all alike (an x86 box) uses them all. Either way only cores the process may run on
//! (its affinity mask, `taskset`) are used.

use std::path::Path;

use crate::CpuError;

/// Largest CPU number accepted in a core list.
pub const MAX_CPU: usize = rustix::thread::CpuSet::MAX_CPU;

/// One logical CPU as sysfs describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Core {
    /// Its number (`cpuN`).
    pub id: usize,
    /// `cpu_capacity` (1024 for the fastest core), where the kernel gives one.
    pub capacity: Option<u64>,
    /// `cpufreq/cpuinfo_max_freq` in kHz, where the kernel gives one.
    pub max_freq_khz: Option<u64>,
}

/// The online CPUs of the machine.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Topology {
    /// In CPU-number order.
    pub cores: Vec<Core>,
}

/// Where the chosen cores came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CoreSource {
    /// The core list the user gave (`--cpus`).
    List,
    /// The big cores of a big.LITTLE chip, by `cpu_capacity`.
    BigByCapacity,
    /// The big cores of a big.LITTLE chip, by maximum frequency.
    BigByFrequency,
    /// Every core the process may run on (the cores are alike, or sysfs says nothing).
    All,
}

impl std::fmt::Display for CoreSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            CoreSource::List => "the core list given",
            CoreSource::BigByCapacity => "the big cores (highest cpu_capacity)",
            CoreSource::BigByFrequency => "the big cores (highest cpuinfo_max_freq)",
            CoreSource::All => "every core",
        })
    }
}

/// What the user asked for (`--threads`, `--cpus`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CpuOptions {
    /// Worker threads (`None`: one per chosen core).
    pub threads: Option<usize>,
    /// The cores to run on (`None`: the big cores, see the module docs).
    pub cpus: Option<Vec<usize>>,
    /// MoE models: readahead and pinning of the experts (`--no-prefetch`, `--pin-mb`).
    pub expert_reads: crate::ExpertReadOptions,
}

/// The cores and threads the engine runs with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CoreChoice {
    /// The cores every worker may run on (its affinity mask).
    pub cores: Vec<usize>,
    /// Worker threads.
    pub threads: usize,
    /// Why these cores.
    pub source: CoreSource,
}

impl Topology {
    /// Read the topology under `root` (`/sys/devices/system/cpu` on Linux; a fake tree in
    /// tests). Missing files mean "not known", never an error: the CPUs are `online`'s list, else
    /// the `cpuN` directories.
    pub fn read(root: &Path) -> Topology {
        let read = |p: &Path| std::fs::read_to_string(p).ok();
        let mut ids = read(&root.join("online"))
            .and_then(|s| parse_cpu_list(&s).ok())
            .unwrap_or_default();
        if ids.is_empty() {
            ids = std::fs::read_dir(root)
                .into_iter()
                .flatten()
                .flatten()
                .filter_map(|e| e.file_name().to_str()?.strip_prefix("cpu")?.parse().ok())
                .filter(|&id: &usize| id < MAX_CPU)
                .collect();
            ids.sort_unstable();
        }
        let number = |p: &Path| read(p).and_then(|s| s.trim().parse::<u64>().ok());
        let cores = ids
            .into_iter()
            .map(|id| {
                let dir = root.join(format!("cpu{id}"));
                Core {
                    id,
                    capacity: number(&dir.join("cpu_capacity")),
                    max_freq_khz: number(&dir.join("cpufreq/cpuinfo_max_freq")),
                }
            })
            .collect();
        Topology { cores }
    }

    /// This machine's topology (`/sys/devices/system/cpu`).
    pub fn system() -> Topology {
        Topology::read(Path::new("/sys/devices/system/cpu"))
    }

    /// The big cores among `allowed` and how they were told apart: the cores of the highest
    /// `cpu_capacity` when every allowed core has one and they differ, else of the highest
    /// maximum frequency likewise, else all of `allowed`.
    pub fn big_cores(&self, allowed: &[usize]) -> (Vec<usize>, CoreSource) {
        let cores: Vec<&Core> = self
            .cores
            .iter()
            .filter(|c| allowed.contains(&c.id))
            .collect();
        let by = |key: fn(&Core) -> Option<u64>| -> Option<Vec<usize>> {
            let values: Option<Vec<u64>> = cores.iter().map(|c| key(c)).collect();
            let values = values?;
            let (lo, hi) = (values.iter().min()?, values.iter().max()?);
            (lo != hi).then(|| {
                cores
                    .iter()
                    .zip(&values)
                    .filter(|(_, v)| *v == hi)
                    .map(|(c, _)| c.id)
                    .collect()
            })
        };
        if let Some(big) = by(|c| c.capacity) {
            return (big, CoreSource::BigByCapacity);
        }
        if let Some(big) = by(|c| c.max_freq_khz) {
            return (big, CoreSource::BigByFrequency);
        }
        (allowed.to_vec(), CoreSource::All)
    }

    /// Every core the CPU engine may run on: the online cores within `allowed` (the process's
    /// affinity mask), or `allowed` alone where sysfs lists no core (a sandbox).
    pub fn usable_cores(&self, allowed: &[usize]) -> Vec<usize> {
        let online: Vec<usize> = self
            .cores
            .iter()
            .map(|c| c.id)
            .filter(|c| allowed.contains(c))
            .collect();
        if online.is_empty() {
            allowed.to_vec()
        } else {
            online
        }
    }

    /// The cores and threads for `options`, among the cores the process may run on (`allowed`,
    /// its affinity mask).
    ///
    /// # Errors
    /// [`CpuError::Threads`]: a listed core that is not online or not allowed, an empty list,
    /// 0 threads, or no allowed core at all.
    pub fn choose(&self, allowed: &[usize], options: &CpuOptions) -> Result<CoreChoice, CpuError> {
        let bad = |what: String| CpuError::Threads { what };
        let (cores, source) = match &options.cpus {
            Some(list) => {
                if list.is_empty() {
                    return Err(bad("the core list is empty".to_owned()));
                }
                for &c in list {
                    if !self.cores.iter().any(|k| k.id == c) {
                        return Err(bad(format!("cpu {c} is not an online CPU of this machine")));
                    }
                    if !allowed.contains(&c) {
                        return Err(bad(format!(
                            "cpu {c} is outside the cores this process may run on ({})",
                            format_cpu_list(allowed)
                        )));
                    }
                }
                let mut list = list.clone();
                list.sort_unstable();
                list.dedup();
                (list, CoreSource::List)
            }
            None => self.big_cores(&self.usable_cores(allowed)),
        };
        if cores.is_empty() {
            return Err(bad("no core to run on".to_owned()));
        }
        let threads = options.threads.unwrap_or(cores.len());
        if threads == 0 {
            return Err(bad("0 threads".to_owned()));
        }
        Ok(CoreChoice {
            cores,
            threads,
            source,
        })
    }
}

/// Parse a CPU list as sysfs and `taskset -c` write it: `0-3,6,8-9`.
///
/// # Errors
/// Anything else (empty items, a range running backwards, a CPU at or above [`MAX_CPU`]),
/// described.
pub fn parse_cpu_list(s: &str) -> Result<Vec<usize>, String> {
    let mut out = Vec::new();
    let num = |t: &str| -> Result<usize, String> {
        let v: usize = t
            .trim()
            .parse()
            .map_err(|_| format!("'{t}' is not a CPU number"))?;
        if v >= MAX_CPU {
            return Err(format!(
                "cpu {v} is above the largest CPU number {}",
                MAX_CPU - 1
            ));
        }
        Ok(v)
    };
    for item in s.trim().split(',') {
        match item.split_once('-') {
            Some((a, b)) => {
                let (a, b) = (num(a)?, num(b)?);
                if a > b {
                    return Err(format!("the range '{item}' runs backwards"));
                }
                out.extend(a..=b);
            }
            None => out.push(num(item)?),
        }
    }
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

/// Write a CPU list compactly (`0-3,6`).
pub fn format_cpu_list(cpus: &[usize]) -> String {
    let mut sorted = cpus.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let mut parts = Vec::new();
    let mut i = 0;
    while i < sorted.len() {
        let mut j = i;
        while j + 1 < sorted.len() && sorted[j + 1] == sorted[j] + 1 {
            j += 1;
        }
        parts.push(if i == j {
            sorted[i].to_string()
        } else {
            format!("{}-{}", sorted[i], sorted[j])
        });
        i = j + 1;
    }
    parts.join(",")
}

/// The machine's RAM: `MemTotal` of `/proc/meminfo`, in bytes.
///
/// # Errors
/// The file cannot be read or has no parsable `MemTotal` line.
pub fn ram_bytes() -> std::io::Result<u64> {
    let text = std::fs::read_to_string("/proc/meminfo")?;
    kb_field(&text, "MemTotal")
        .ok_or_else(|| std::io::Error::other("/proc/meminfo: no 'MemTotal: N kB' line"))
}

/// The value of a `KEY:   N kB` line (`/proc/meminfo`, `/proc/PID/status`), in bytes.
pub(crate) fn kb_field(text: &str, key: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
        .and_then(|v| v.trim().strip_suffix("kB"))
        .and_then(|kb| kb.trim().parse::<u64>().ok())
        .and_then(|kb| kb.checked_mul(1024))
}
