//! Prefix reuse: a request whose tokens begin with a finished sequence's reuses its KV cache and
//! answers exactly as served cold (greedy), with an f16 and an f32 cache; a prefix is never
//! used by another model or cache type.
use super::common::*;
use ork_exec::KvType;
use ork_runtime::{DeviceKind, Engine, EngineConfig, PackChoice};
use ork_server::{PrefixCache, ServeConfig, Server};
use serde_json::{json, Value};

fn engine_kv(kv: KvType) -> Engine {
    let mut c = EngineConfig::new(ork_testkit::model_path());
    c.pack = PackChoice::Path(pack_path());
    c.budget_bytes = Some(1024 << 20);
    c.device = DeviceKind::Emu;
    c.kv_cache = kv;
    Engine::open(c).unwrap()
}

fn serve(kv: KvType, prefix_cache_bytes: usize) -> Server {
    let config = ServeConfig {
        port: 0,
        prefix_cache_bytes,
        ..ServeConfig::default()
    };
    Server::start(engine_kv(kv), config).unwrap()
}

/// (text, prompt tokens, cached tokens) of a non-streamed answer.
async fn answer(
    client: &reqwest::Client,
    server: &Server,
    path: &str,
    body: Value,
) -> (String, u64, u64) {
    let (s, v) = post(client, &format!("{}{path}", base(server)), &body).await;
    assert_eq!(s, 200, "{v}");
    let c = &v["choices"][0];
    let text = c["message"]["content"]
        .as_str()
        .or(c["text"].as_str())
        .unwrap()
        .to_owned();
    let u = &v["usage"];
    (
        text,
        u["prompt_tokens"].as_u64().unwrap(),
        u["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reused_prefix_answers_exactly_as_a_cold_one() {
    let _engines = MEMORY.lock().await;
    let client = reqwest::Client::new();
    for kv in [KvType::F16, KvType::F32] {
        let warm = serve(kv, 256 << 20);
        let cold = serve(kv, 0);
        let model = warm.model_id().to_owned();
        let mut reported = 0;
        // A conversation: the second turn carries the first and its answer.
        let mut messages = vec![
            json!({"role": "system", "content": "You are a helpful assistant who answers briefly."}),
            json!({"role": "user", "content": "Name three colours of the rainbow."}),
        ];
        let turn = |messages: &Vec<Value>| json!({"model": model, "messages": messages, "max_tokens": 12, "temperature": 0});
        let (first, first_prompt, cached) =
            answer(&client, &warm, "/v1/chat/completions", turn(&messages)).await;
        assert_eq!(cached, 0, "{kv:?}: nothing to reuse yet");
        messages.push(json!({"role": "assistant", "content": first}));
        messages
            .push(json!({"role": "user", "content": "And three animals that live in the sea?"}));
        let (w, w_prompt, w_cached) =
            answer(&client, &warm, "/v1/chat/completions", turn(&messages)).await;
        let (c, c_prompt, c_cached) =
            answer(&client, &cold, "/v1/chat/completions", turn(&messages)).await;
        assert_eq!(w, c, "{kv:?}: the reused prefix changed the answer");
        assert_eq!((w_prompt, c_cached), (c_prompt, 0));
        assert!(
            w_cached >= first_prompt,
            "{kv:?}: {w_cached} of {w_prompt} prompt tokens reused, the first turn had {first_prompt}"
        );
        reported += w_cached;
        // Completions, a prompt that shares only part of a cached sequence (its copy is used).
        let p1 = "The three largest cities of France are Paris,";
        let body =
            |p: &str| json!({"model": model, "prompt": p, "max_tokens": 10, "temperature": 0});
        let (_, _, cached) = answer(&client, &warm, "/v1/completions", body(p1)).await;
        reported += cached;
        let p2 = format!("{p1} and the longest river of France is");
        let (w, _, w_cached) = answer(&client, &warm, "/v1/completions", body(&p2)).await;
        let (c, _, _) = answer(&client, &cold, "/v1/completions", body(&p2)).await;
        assert_eq!(w, c, "{kv:?}: a forked prefix changed the answer");
        assert!(w_cached > 0, "{kv:?}: the shared prefix was not reused");
        reported += w_cached;
        // The same again: the whole prompt but its last token is cached.
        let (w2, n, again) = answer(&client, &warm, "/v1/completions", body(&p2)).await;
        assert_eq!(w2, c);
        assert_eq!(again, n - 1, "{kv:?}");
        reported += again;
        assert_eq!(
            metric(&client, &warm, "ork_prompt_tokens_cached_total", "").await as u64,
            reported
        );
        assert!(metric(&client, &warm, "ork_prefix_cache_bytes", "").await > 0.0);
        assert_eq!(
            metric(&client, &cold, "ork_prompt_tokens_cached_total", "").await,
            0.0
        );
        assert_eq!(
            metric(&client, &cold, "ork_prefix_cache_bytes", "").await,
            0.0
        );
    }
}

#[test]
fn a_prefix_is_never_used_by_another_model_or_cache_type() {
    let _engines = MEMORY.blocking_lock();
    let f16 = engine_kv(KvType::F16);
    let f32 = engine_kv(KvType::F32);
    let other = engine_kv(KvType::F16);
    let tokens = vec![1, 2, 3, 4, 5, 6];
    let mut s = f16.session_with_context(64).unwrap();
    s.prefill(&tokens).unwrap();
    let one = s.kv_bytes();
    let mut cache = PrefixCache::new(1 << 30);
    cache.insert(tokens.clone(), s);
    let prompt = [1, 2, 3, 4, 5, 6, 7];
    for fresh in [&f32, &other] {
        let fresh = fresh.session_with_context(64).unwrap();
        assert!(cache.take(&prompt, &fresh).is_none());
    }
    // Part of it, for the same engine: a copy, the entry stays.
    let fresh = f16.session_with_context(64).unwrap();
    let (got, len) = cache.take(&[1, 2, 3, 9], &fresh).unwrap();
    assert_eq!((len, got.position(), cache.len()), (3, 3, 1));
    // All of it: the session itself, the entry goes.
    let (got, len) = cache.take(&prompt, &fresh).unwrap();
    assert_eq!(
        (len, got.position(), cache.len(), cache.bytes()),
        (6, 6, 0, 0)
    );
    // The budget holds: a second entry evicts the least recently used one.
    let mut cache = PrefixCache::new(one * 3 / 2);
    cache.insert(tokens.clone(), got);
    let mut s = f16.session_with_context(64).unwrap();
    s.prefill(&[9, 8, 7, 6, 5, 4]).unwrap();
    cache.insert(vec![9, 8, 7, 6, 5, 4], s);
    assert_eq!((cache.len(), cache.bytes()), (1, one));
    assert!(cache.take(&prompt, &fresh).is_none());
    assert!(cache.take(&[9, 8, 7, 6, 5, 4, 3], &fresh).is_some());
}

/// The tiny gemma3 (window 4; crates/ork-exec/tests/golden) on the emulated device, f32 cache.
fn tiny_gemma3() -> Engine {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../ork-exec/tests/golden/gemma3_tiny.gguf"
    );
    let mut c = EngineConfig::new(std::path::PathBuf::from(path));
    c.pack = PackChoice::None;
    c.device = DeviceKind::Emu;
    c.kv_cache = KvType::F32;
    Engine::open(c).unwrap()
}

/// The largest |a − b|.
fn apart(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .fold(0.0f32, |m, (x, y)| m.max((x - y).abs()))
}

/// A gemma3 entry run past its window (its local layers dropped their early positions) serves a
/// prompt that shares all of it or a prefix it still holds the window of — with the cold
/// batch's logits — and none that shares less (the request is then prefilled cold); an entry
/// extended by one that cannot give its prefixes stays.
#[test]
fn a_gemma3_prefix_is_reused_while_its_window_is_held_else_prefilled_cold() {
    let engine = tiny_gemma3();
    let v = engine.model().config().vocab_size as u32;
    let ctx = 128;
    let toks: Vec<u32> = (0..80u32).map(|i| (i * 7919 + 3) % v).collect();
    let session = || engine.session_with_context(ctx).unwrap();
    let mut s = session();
    for &t in &toks[..60] {
        s.decode(t).unwrap();
    }
    let m = s.min_prefix();
    assert!(m > 1 && m < 60, "{m}");
    let mut cache = PrefixCache::new(1 << 30);
    // A short entry (nothing dropped) that the long one extends: kept beside it.
    let mut short = session();
    short.prefill(&toks[..3]).unwrap();
    cache.insert(toks[..3].to_vec(), short);
    cache.insert(toks[..60].to_vec(), s);
    assert_eq!(
        cache.len(),
        2,
        "the short entry was dropped for one that cannot give it"
    );
    let fresh = session();

    // Shares m − 1 tokens with the long entry: only the short entry's 3 can be reused.
    let mut prompt = toks[..m - 1].to_vec();
    prompt.extend([(toks[m - 1] + 1) % v, 5, 6]);
    let (got, len) = cache.take(&prompt, &fresh).unwrap();
    assert_eq!((len, got.position(), cache.len()), (3, 3, 1));
    // Without the short entry: nothing (a cold prefill).
    let mut only_long = PrefixCache::new(1 << 30);
    let mut s = session();
    for &t in &toks[..60] {
        s.decode(t).unwrap();
    }
    only_long.insert(toks[..60].to_vec(), s);
    assert!(only_long.take(&prompt, &fresh).is_none());
    assert_eq!(only_long.len(), 1);

    // Shares m + 2 tokens: a copy, and the rest gives the cold batch's logits.
    for shared in [m, m + 2] {
        let mut prompt = toks[..shared].to_vec();
        prompt.extend([(toks[shared] + 1) % v, 7, 8, 9]);
        let cold = session().forward_all(&prompt).unwrap();
        let (mut got, len) = only_long.take(&prompt, &fresh).unwrap();
        assert_eq!((len, got.position(), only_long.len()), (shared, shared, 1));
        let warm = got.forward_all(&prompt[shared..]).unwrap();
        let d = apart(&warm, &cold[shared * v as usize..]);
        eprintln!("gemma3 prefix of {shared} (min {m}): {d:.2e} from cold");
        assert!(d < 1e-3, "{d}");
    }
    // All of it, and on: the session itself continues.
    let cold = session().forward_all(&toks).unwrap();
    let (mut got, len) = only_long.take(&toks, &fresh).unwrap();
    assert_eq!((len, only_long.len()), (60, 0));
    let warm = got.forward_all(&toks[60..]).unwrap();
    let d = apart(&warm, &cold[60 * v as usize..]);
    assert!(d < 1e-3, "{d}");
}

fn serve_in(kv: KvType, dir: &std::path::Path) -> Server {
    let config = ServeConfig {
        port: 0,
        prefix_cache_dir: Some(dir.to_owned()),
        ..ServeConfig::default()
    };
    Server::start(engine_kv(kv), config).unwrap()
}

/// `--prefix-cache-dir`: a restarted server answers the next turn from the prefix its
/// predecessor wrote, exactly as cold; a server of another cache type keeps its own file and
/// reuses nothing of the other's; a damaged file is refused whole (the server starts and
/// answers cold) and replaced by a good one when the server stops.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_server_reuses_the_prefixes_it_wrote() {
    let _engines = MEMORY.lock().await;
    let client = reqwest::Client::new();
    let dir = tempfile::tempdir().unwrap();
    let files = || -> Vec<std::path::PathBuf> {
        // The prefix files (beside them: their locks and the model's digest).
        let mut f: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "orkkv"))
            .collect();
        f.sort();
        f
    };
    let mut messages = vec![
        json!({"role": "system", "content": "You are a helpful assistant who answers briefly."}),
        json!({"role": "user", "content": "Name three colours of the rainbow."}),
    ];
    let turn = |model: &str, messages: &Vec<Value>| json!({"model": model, "messages": messages, "max_tokens": 12, "temperature": 0});
    let first = serve_in(KvType::F16, dir.path());
    let model = first.model_id().to_owned();
    let (answer1, first_prompt, _) = answer(
        &client,
        &first,
        "/v1/chat/completions",
        turn(&model, &messages),
    )
    .await;
    let s = tokio::task::spawn_blocking(move || first.shutdown())
        .await
        .unwrap();
    s.unwrap();
    let saved = files();
    assert_eq!(saved.len(), 1, "{saved:?}");
    assert!(saved[0].to_string_lossy().ends_with(".orkkv"));
    // It holds the conversation: its owner's only.
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&saved[0]).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "{mode:o}");

    messages.push(json!({"role": "assistant", "content": answer1}));
    messages.push(json!({"role": "user", "content": "And three animals that live in the sea?"}));
    let cold = serve(KvType::F16, 0);
    let (c, _, _) = answer(
        &client,
        &cold,
        "/v1/chat/completions",
        turn(&model, &messages),
    )
    .await;
    drop(cold);

    // The restart reads it: the second turn reuses the first's prefix, same answer.
    let second = serve_in(KvType::F16, dir.path());
    assert!(metric(&client, &second, "ork_prefix_cache_bytes", "").await > 0.0);
    let (w, _, cached) = answer(
        &client,
        &second,
        "/v1/chat/completions",
        turn(&model, &messages),
    )
    .await;
    assert_eq!(w, c, "the restored prefix changed the answer");
    assert!(cached >= first_prompt, "{cached} < {first_prompt}");
    drop(second);

    // Another cache type: its own file, nothing reused from the f16 one.
    let other = serve_in(KvType::F32, dir.path());
    assert_eq!(
        metric(&client, &other, "ork_prefix_cache_bytes", "").await,
        0.0
    );
    let (_, _, cached) = answer(
        &client,
        &other,
        "/v1/chat/completions",
        turn(&model, &messages),
    )
    .await;
    assert_eq!(cached, 0);
    drop(other);
    assert_eq!(files().len(), 2, "{:?}", files());

    // A damaged file: refused whole, the server answers cold, and writes a good one at the end.
    let mut bytes = std::fs::read(&saved[0]).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x40;
    std::fs::write(&saved[0], &bytes).unwrap();
    let damaged = serve_in(KvType::F16, dir.path());
    assert_eq!(
        metric(&client, &damaged, "ork_prefix_cache_bytes", "").await,
        0.0
    );
    let (w, _, cached) = answer(
        &client,
        &damaged,
        "/v1/chat/completions",
        turn(&model, &messages),
    )
    .await;
    assert_eq!((w.as_str(), cached), (c.as_str(), 0));
    drop(damaged);
    let restarted = serve_in(KvType::F16, dir.path());
    let (w, _, cached) = answer(
        &client,
        &restarted,
        "/v1/chat/completions",
        turn(&model, &messages),
    )
    .await;
    assert_eq!(w, c);
    assert!(cached > 0, "the file written after the damaged one is read");
    drop(restarted);
}

/// The file format refuses what it cannot trust, naming the file: not a saved cache, another
/// identity, a cut-short file; no file is an empty load.
#[test]
fn a_saved_prefix_file_is_checked_before_use() {
    let _engines = MEMORY.blocking_lock();
    let engine = engine_kv(KvType::F16);
    let dir = tempfile::tempdir().unwrap();
    let fresh = || engine.session_with_context(256).ok();
    let mut cache = PrefixCache::new(64 << 20);
    let mut s = fresh().unwrap();
    let tokens: Vec<u32> = (1..40).collect();
    s.prefill(&tokens).unwrap();
    cache.insert(tokens.clone(), s);
    let path = PrefixCache::file_in(dir.path(), 7);
    let model = ork_testkit::model_path();
    cache.save(&path, 7, &[model.as_path()]).unwrap();
    // The output rule: never over the model.
    let e = cache.save(&model, 7, &[model.as_path()]).unwrap_err();
    assert!(
        e.contains("model") || e.contains("input") || e.contains("refus"),
        "{e}"
    );
    let mut back = PrefixCache::new(64 << 20);
    let l = back.load(&path, 7, fresh).unwrap();
    assert_eq!((l.entries, l.kept, l.tokens), (1, 1, 39));
    assert_eq!(back.bytes(), cache.bytes());
    let e = PrefixCache::new(64 << 20)
        .load(&path, 8, fresh)
        .unwrap_err();
    assert!(
        e.contains("identity") && e.contains(&path.display().to_string()),
        "{e}"
    );
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() - 100]).unwrap();
    let e = PrefixCache::new(64 << 20)
        .load(&path, 7, fresh)
        .unwrap_err();
    assert!(e.contains("checksum"), "{e}");
    std::fs::write(&path, b"hello").unwrap();
    let e = PrefixCache::new(64 << 20)
        .load(&path, 7, fresh)
        .unwrap_err();
    assert!(e.contains("not a saved ork prefix cache"), "{e}");
    let none = PrefixCache::new(64 << 20)
        .load(&dir.path().join("absent.orkkv"), 7, fresh)
        .unwrap();
    assert_eq!(none.entries, 0);
    // A directory or a FIFO in its place: refused naming what it is, never read (or waited on).
    let e = PrefixCache::new(64 << 20)
        .load(dir.path(), 7, fresh)
        .unwrap_err();
    assert!(e.contains("directory"), "{e}");
}

/// A restart with a smaller budget keeps the newest entries that fit, instead of refusing the
/// file (and then writing an empty one over it at stop).
#[test]
fn a_smaller_budget_keeps_the_newest_entries_that_fit() {
    let _engines = MEMORY.blocking_lock();
    let engine = engine_kv(KvType::F16);
    let dir = tempfile::tempdir().unwrap();
    let fresh = || engine.session_with_context(256).ok();
    let mut cache = PrefixCache::new(64 << 20);
    for start in [100u32, 200, 300, 400] {
        let mut s = fresh().unwrap();
        let tokens: Vec<u32> = (start..start + 60).collect();
        s.prefill(&tokens).unwrap();
        cache.insert(tokens, s);
    }
    assert_eq!(cache.len(), 4);
    let one = cache.bytes() / 4;
    let path = PrefixCache::file_in(dir.path(), 7);
    cache.save(&path, 7, &[]).unwrap();
    // Room for two and a half entries (the file is ~4 entries: more than twice the budget).
    let mut small = PrefixCache::new(one * 5 / 2);
    let l = small.load(&path, 7, fresh).unwrap();
    assert_eq!((l.entries, l.kept), (4, 2), "{l:?}");
    // The newest two: a prompt that starts like the last one inserted reuses it.
    let prompt: Vec<u32> = (400..470).collect();
    let (_, reused) = small.take(&prompt, &fresh().unwrap()).unwrap();
    assert_eq!(reused, 60);
}

/// A write cut by a crash leaves a temporary file: the next server removes those older than ten
/// minutes from the prefix cache's directory, and leaves a younger one (a live writer's).
#[test]
fn a_cut_writes_temporary_file_is_removed_at_start() {
    let _engines = MEMORY.blocking_lock();
    let dir = tempfile::tempdir().unwrap();
    let (old, young) = (
        dir.path().join(".ork-output-cut"),
        dir.path().join(".ork-output-live"),
    );
    for p in [&old, &young] {
        std::fs::write(p, b"partial").unwrap();
    }
    let hour_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
    std::fs::File::options()
        .write(true)
        .open(&old)
        .unwrap()
        .set_modified(hour_ago)
        .unwrap();
    let server = serve_in(KvType::F16, dir.path());
    assert!(!old.exists(), "the stale temporary file is still there");
    assert!(young.exists(), "a young temporary file was removed");
    drop(server);
}

/// One chat turn on `server` (its prefix is then cached), and the server stopped (the file
/// written).
async fn one_turn_and_stop(client: &reqwest::Client, server: Server, text: &str) {
    let model = server.model_id().to_owned();
    let body = json!({"model": model, "max_tokens": 2, "temperature": 0,
        "messages": [{"role": "user", "content": text}]});
    answer(client, &server, "/v1/chat/completions", body).await;
    tokio::task::spawn_blocking(move || server.shutdown())
        .await
        .unwrap()
        .unwrap();
}

fn orkkv(dir: &std::path::Path) -> std::path::PathBuf {
    let mut found: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "orkkv"))
        .collect();
    assert_eq!(found.len(), 1, "{found:?}");
    found.pop().unwrap()
}

/// The prefix file is only ever written inside DIR: a link in its place (to a file outside) is
/// refused, never written through; its target keeps its bytes and mode, and no temporary file
/// is created beside it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_prefix_file_is_never_written_through_a_link() {
    let _engines = MEMORY.lock().await;
    let client = reqwest::Client::new();
    let root = tempfile::tempdir().unwrap();
    let (dir, out) = (root.path().join("dir"), root.path().join("out"));
    std::fs::create_dir_all(&out).unwrap();
    one_turn_and_stop(&client, serve_in(KvType::F16, &dir), "Hi").await;
    let file = orkkv(&dir);
    let victim = out.join("victim.txt");
    std::fs::write(&victim, b"precious\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o644)).unwrap();
    std::fs::remove_file(&file).unwrap();
    std::os::unix::fs::symlink(&victim, &file).unwrap();
    one_turn_and_stop(&client, serve_in(KvType::F16, &dir), "Hello there").await;
    assert_eq!(std::fs::read(&victim).unwrap(), b"precious\n");
    let mode = std::fs::metadata(&victim).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o644, "{mode:o}");
    assert_eq!(
        std::fs::read_dir(&out).unwrap().count(),
        1,
        "a file appeared in out/"
    );
    assert!(std::fs::symlink_metadata(&file)
        .unwrap()
        .file_type()
        .is_symlink());
}

/// Two servers on one DIR and model: the first holds the file's lock and is its one writer; the
/// second reads it at start, is told, and never writes it (its entries would replace the
/// first's). A temporary file of that prefix file left by a cut write is removed by the lock
/// holder at start whatever its age; another young temporary file is left alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_server_writes_a_prefix_file_and_cut_writes_do_not_pile_up() {
    let _engines = MEMORY.lock().await;
    let client = reqwest::Client::new();
    let dir = tempfile::tempdir().unwrap();
    one_turn_and_stop(&client, serve_in(KvType::F16, dir.path()), "Hi").await;
    let file = orkkv(dir.path());
    let name = file.file_name().unwrap().to_string_lossy().into_owned();
    let (ours, other) = (
        dir.path().join(format!(".ork-output-{name}.cut123")),
        dir.path().join(".ork-output-live"),
    );
    for p in [&ours, &other] {
        std::fs::write(p, b"partial").unwrap();
    }
    let first = serve_in(KvType::F16, dir.path());
    assert!(
        !ours.exists(),
        "the cut write's temporary file is still there"
    );
    assert!(
        other.exists(),
        "a young temporary file of another writer was removed"
    );
    let second = serve_in(KvType::F16, dir.path());
    one_turn_and_stop(&client, first, "Name a colour.").await;
    let written = std::fs::read(&file).unwrap();
    one_turn_and_stop(&client, second, "Name an animal.").await;
    assert_eq!(
        std::fs::read(&file).unwrap(),
        written,
        "the second server wrote over the first's file"
    );
}

/// The numbers identity hashes every byte of every tensor: halving one block of `token_embd`
/// outside the staleness fingerprint's sampled windows changes it (a restarted server then
/// reads nothing of the old file). The digest is cached in DIR and used while the file is
/// unchanged.
#[test]
fn an_edit_anywhere_in_the_numbers_changes_the_identity() {
    let _engines = MEMORY.blocking_lock();
    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("m.gguf");
    std::fs::copy(ork_testkit::model_path(), &model).unwrap();
    let open = || {
        let mut c = EngineConfig::new(&model);
        c.pack = PackChoice::None;
        c.device = DeviceKind::Emu;
        Engine::open(c).unwrap()
    };
    let digests = tmp.path().join("dir");
    std::fs::create_dir(&digests).unwrap();
    let (before, at) = {
        let e = open();
        let t = e.gguf().tensor("token_embd.weight").unwrap();
        assert!(t.size > 1 << 20, "{}", t.size);
        // Between the fingerprint's first and second sampled 4 KiB windows (64 KiB edge, then
        // windows spread over the rest): unsampled.
        let at = t.offset + (64 << 10) + t.size / 32;
        let id = e.numbers_identity(256, Some(&digests));
        assert_eq!(e.numbers_identity(256, Some(&digests)), id);
        assert_eq!(e.numbers_identity(256, None), id);
        (id, at)
    };
    assert_eq!(std::fs::read_dir(&digests).unwrap().count(), 1);
    let mut bytes = std::fs::read(&model).unwrap();
    bytes[at as usize] ^= 0x10;
    std::fs::write(&model, &bytes).unwrap();
    let e = open();
    assert_ne!(e.numbers_identity(256, Some(&digests)), before);
    assert_ne!(e.numbers_identity(256, None), before);
}
