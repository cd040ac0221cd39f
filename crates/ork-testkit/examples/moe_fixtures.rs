//! Make (or find) the cached MoE fixtures and print their paths, one `NAME PATH` a line
//! (scripts/moe_golden.py reads them).
//!
//! `moe_fixtures NAME DIR` instead makes that one fixture (`identical`, `perturbed`, `qwen3moe`,
//! `qwen2moe`) afresh into DIR, whose pages then come from storage once dropped from the page
//! cache (scripts/moe-readahead.sh), and prints its path.
use std::process::ExitCode;

use ork_testkit::moe::MoeFixture;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.as_slice() {
        [] => {
            for kind in MoeFixture::ALL {
                let path = ork_testkit::moe::moe_fixture(kind);
                println!("{} {}", kind.name(), path.display());
            }
            ExitCode::SUCCESS
        }
        [name, dir] => {
            let Some(kind) = MoeFixture::ALL.into_iter().find(|k| k.name() == name) else {
                eprintln!(
                    "error: no MoE fixture '{name}' (identical, perturbed, qwen3moe, qwen2moe)"
                );
                return ExitCode::from(2);
            };
            let src = match ork_gguf::GgufFile::open(&ork_testkit::model_path()) {
                Ok(src) => src,
                Err(e) => {
                    eprintln!("error: {e}");
                    return ExitCode::from(2);
                }
            };
            let dst = std::path::Path::new(dir).join(kind.file_name());
            if let Err(e) = ork_testkit::moe::make(kind, &src, &dst) {
                eprintln!("error: making {}: {e}", dst.display());
                return ExitCode::from(1);
            }
            println!("{}", dst.display());
            ExitCode::SUCCESS
        }
        _ => {
            eprintln!("usage: moe_fixtures [NAME DIR]");
            ExitCode::from(2)
        }
    }
}
