//! `ork serve` as a process: it says where it listens, serves, and on SIGTERM drains — no new
//! requests, the running one finishes — and exits 0. (The API itself is tested in
//! `crates/ork-server/tests`.)
use super::{converted, model, ork};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::Stdio;
use std::time::{Duration, Instant};

fn request(addr: &str, method: &str, path: &str, body: &str) -> TcpStream {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    s
}

#[test]
fn serve_drains_on_sigterm_and_exits_0() {
    drains_on_sigterm(converted(), &[]);
}

/// The process wrote its .orkpack at start-up, which armed the pack writer's signal cleanup:
/// SIGTERM must still drain (it used to kill the process, exit 143, streams without [DONE]).
#[test]
fn serve_that_wrote_its_pack_at_start_up_still_drains_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let pack = dir.path().join("fresh.orkpack");
    drains_on_sigterm(&pack, &[]);
    assert!(pack.exists(), "the pack was written at start-up");
}

/// A running `ork serve` (emulated device, a free port, `extra` options), once it printed where
/// it listens.
struct Serving {
    child: std::process::Child,
    addr: String,
    model_id: String,
    /// Its stderr up to the line saying where it listens.
    before: Vec<String>,
    /// The rest of its stderr, read to the end on a thread (so it never blocks on a full pipe).
    rest: std::thread::JoinHandle<Vec<String>>,
}

fn serve(pack: &std::path::Path, extra: &[&std::ffi::OsStr]) -> Serving {
    let mut child = ork()
        .args(["serve", "--model", model().to_str().unwrap(), "--pack"])
        .arg(pack)
        .args(["--device", "emu", "--port", "0", "--budget-mb", "1024"])
        .args(extra)
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let mut before = Vec::new();
    let (addr, model_id) = loop {
        let line = lines
            .next()
            .expect("ork serve printed where it listens")
            .unwrap();
        before.push(line.clone());
        if let Some(rest) = line.strip_prefix("[ork] serving ") {
            let (id, url) = rest.split_once(" on http://").unwrap();
            break (url.to_owned(), id.to_owned());
        }
    };
    let rest = std::thread::spawn(move || lines.map_while(Result::ok).collect::<Vec<_>>());
    Serving {
        child,
        addr,
        model_id,
        before,
        rest,
    }
}

/// Serve with `extra` options, stream one request, SIGTERM during it: the request finishes,
/// the server exits 0. Returns its stderr.
fn drains_on_sigterm(pack: &std::path::Path, extra: &[&std::ffi::OsStr]) -> String {
    let Serving {
        mut child,
        addr,
        model_id,
        mut before,
        rest,
    } = serve(pack, extra);

    let body = format!(
        r#"{{"model":"{model_id}","messages":[{{"role":"user","content":"Count to thirty."}}],"max_tokens":24,"temperature":0,"stream":true}}"#
    );
    let mut stream = request(&addr, "POST", "/v1/chat/completions", &body);
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&got).contains("data: ") {
        let n = stream.read(&mut buf).unwrap();
        assert!(n > 0, "the stream ended before its first chunk");
        got.extend_from_slice(&buf[..n]);
    }
    let pid = rustix::process::Pid::from_raw(child.id() as i32).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();

    // The running request finishes.
    stream.read_to_end(&mut got).unwrap();
    let text = String::from_utf8_lossy(&got);
    assert!(text.contains("data: [DONE]"), "{text}");
    assert!(
        text.contains("\"finish_reason\":\"length\"")
            || text.contains("\"finish_reason\":\"stop\""),
        "{text}"
    );
    // New requests are refused (connection refused once the listener is closed, else 503).
    if let Ok(mut s) = TcpStream::connect(&addr) {
        let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
        let _ = write!(
            s,
            "GET /health HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
        );
        let mut answer = String::new();
        let _ = s.read_to_string(&mut answer);
        assert!(
            answer.is_empty() || answer.starts_with("HTTP/1.1 503"),
            "{answer}"
        );
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "ork serve did not exit after the drain"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    before.extend(rest.join().unwrap());
    let stderr = before.join("\n");
    assert_eq!(status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("drained"), "{stderr}");
    stderr
}

/// `--prefix-cache-dir`: the drained server writes its prefix cache (the streamed request's
/// sequence) and a restarted one reads it before it serves; a path that is a file is refused
/// before anything listens, naming the option.
#[test]
fn serve_keeps_its_prefix_cache_across_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let opt = |d: &std::path::Path| [std::ffi::OsString::from("--prefix-cache-dir"), d.into()];
    let args = opt(dir.path());
    let args: Vec<&std::ffi::OsStr> = args.iter().map(|a| a.as_os_str()).collect();
    let first = drains_on_sigterm(converted(), &args);
    assert!(first.contains("1 cached prefixes"), "{first}");
    // One prefix file (beside it: its lock and the model's digest, docs/serve.md).
    let files: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .filter(|e| {
            let name = e.as_ref().unwrap().file_name();
            name.to_string_lossy().ends_with(".orkkv")
        })
        .collect();
    assert_eq!(files.len(), 1);
    let second = drains_on_sigterm(converted(), &args);
    let read = second.find("read from").expect(&second);
    assert!(read < second.find("serving").unwrap(), "{second}");
    assert!(
        second.contains("1 cached prefixes") || second.contains("2 cached prefixes"),
        "{second}"
    );

    let file = dir.path().join("a-file");
    std::fs::write(&file, "x").unwrap();
    let out = ork()
        .args(["serve", "--model", model().to_str().unwrap(), "--pack"])
        .arg(converted())
        .args(["--device", "emu", "--port", "0", "--budget-mb", "1024"])
        .args(opt(&file))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("--prefix-cache-dir") && stderr.contains("a-file"),
        "{stderr}"
    );
    assert!(!stderr.contains("serving"), "{stderr}");
}

/// `--chat-template-file`: a file that cannot be read, or a template that does not parse, is a
/// one-line refusal naming it, before anything listens.
#[test]
fn serve_refuses_an_unreadable_or_broken_chat_template_file() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.jinja");
    let broken = dir.path().join("broken.jinja");
    std::fs::write(&broken, "{% for %}").unwrap();
    for (file, says) in [(&missing, "missing.jinja"), (&broken, "chat template")] {
        let out = ork()
            .args(["serve", "--model", model().to_str().unwrap(), "--pack"])
            .arg(converted())
            .args(["--device", "emu", "--port", "0", "--budget-mb", "1024"])
            .arg("--chat-template-file")
            .arg(file)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{stderr}");
        assert!(stderr.contains(says), "{says:?} not in {stderr}");
        assert!(!stderr.contains("serving"), "{stderr}");
    }
}

/// `--prefix-cache-save-secs`: a server killed without a drain (SIGKILL: a power cut) still
/// leaves the prefix cache it wrote while serving, and the restarted server reads it.
#[test]
fn a_killed_server_leaves_the_prefix_cache_it_wrote_while_serving() {
    let dir = tempfile::tempdir().unwrap();
    let opts = [
        std::ffi::OsString::from("--prefix-cache-dir"),
        dir.path().into(),
        "--prefix-cache-save-secs".into(),
        "1".into(),
    ];
    let opts: Vec<&std::ffi::OsStr> = opts.iter().map(|a| a.as_os_str()).collect();
    let Serving {
        mut child,
        addr,
        model_id: id,
        ..
    } = serve(converted(), &opts);
    let body = format!(
        r#"{{"model":"{id}","messages":[{{"role":"user","content":"Count to ten."}}],"max_tokens":8,"temperature":0}}"#
    );
    let mut answer = String::new();
    request(&addr, "POST", "/v1/chat/completions", &body)
        .read_to_string(&mut answer)
        .unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    // Written within about a second of the answer, while the server runs.
    let deadline = Instant::now() + Duration::from_secs(30);
    let written = || {
        std::fs::read_dir(dir.path())
            .unwrap()
            .any(|e| e.unwrap().file_name().to_string_lossy().ends_with(".orkkv"))
    };
    while !written() {
        assert!(
            Instant::now() < deadline,
            "no prefix cache written while serving"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // The file has its name only once complete (written under a temporary name, renamed).
    child.kill().unwrap();
    child.wait().unwrap();
    let Serving {
        mut child, before, ..
    } = serve(converted(), &opts);
    let stderr = before.join("\n");
    assert!(stderr.contains("1 cached prefixes"), "{stderr}");
    child.kill().unwrap();
    child.wait().unwrap();
}
