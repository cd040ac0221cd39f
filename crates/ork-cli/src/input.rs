//! Text files named on the command line (`--prompt-file`, `perplexity --file`): read under the
//! one rule of `ork_io::input` (regular files only, never blocking, at most
//! [`ork_io::input::TEXT_INPUT_LIMIT`] bytes), then checked to be UTF-8. Errors name the flag
//! and the file.

use std::path::Path;

use anyhow::{Context, Result};

/// The UTF-8 text of `path`, given with `flag`.
pub fn read_text(path: &Path, flag: &str) -> Result<String> {
    let bytes = ork_io::input::read_input(path, ork_io::input::TEXT_INPUT_LIMIT)
        .with_context(|| format!("{flag} {}", path.display()))?;
    String::from_utf8(bytes).map_err(|e| {
        anyhow::anyhow!(
            "{flag} {}: not valid UTF-8 (invalid byte at offset {})",
            path.display(),
            e.utf8_error().valid_up_to()
        )
    })
}
