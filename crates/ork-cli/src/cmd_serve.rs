//! `ork serve`: the OpenAI-compatible server of `ork-server` (docs/serve.md).
use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Result;

use crate::cli::ServeArgs;
use crate::open_model::{engine_config_auto, open_engine};

/// Open the engine, serve until SIGTERM / SIGINT, drain, exit 0.
pub fn serve(args: &ServeArgs) -> Result<ExitCode> {
    let chat_template = match &args.chat_template_file {
        Some(path) => Some(crate::input::read_text(path, "--chat-template-file")?),
        None => None,
    };
    let (mut config, chosen) = engine_config_auto(&args.model, false, false)?;
    let split = crate::cmd_split::resolve_for(&mut config, &args.model, None, &chosen)?;
    let engine = open_engine(config, false)?;
    crate::auto::say(&chosen, &engine);
    crate::open_model::say_engines(&engine);
    for l in split.lines() {
        eprintln!("[ork] {l}");
    }
    let config = ork_server::ServeConfig {
        host: args.host.clone(),
        port: args.port,
        max_seqs: args.max_seqs,
        queue: args.queue,
        context: args.ctx,
        api_key: args.api_key.clone(),
        prefill_chunk: args.prefill_chunk,
        drain_timeout: Duration::from_secs(args.drain_secs),
        model_id: None,
        header_timeout: Duration::from_secs(args.header_timeout_secs),
        body_timeout: Duration::from_secs(args.body_timeout_secs),
        max_connections: args.max_connections,
        prefix_cache_bytes: args.prefix_cache_mb << 20,
        prefix_cache_dir: args.prefix_cache_dir.clone(),
        prefix_cache_save_every: (args.prefix_cache_save_secs > 0)
            .then(|| Duration::from_secs(args.prefix_cache_save_secs)),
        chat_template,
        draft_max: args.draft.is_some().then_some(args.draft_max),
    };
    ork_server::run(engine, config, |addr, model| {
        // One line a script (or a test) can wait for.
        eprintln!("[ork] serving {model} on http://{addr}");
        let _ = std::io::stderr().flush();
    })?;
    eprintln!("[ork] drained, exiting");
    Ok(ExitCode::SUCCESS)
}
