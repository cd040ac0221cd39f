//! The one rule for the runtime library's path (`ORK_RKNN_LIB` or a search path), as for every
//! path ork opens (`docs/cli.md`): a path must name a regular file. `dlopen` opens the file
//! itself, and on a FIFO it waits for a writer forever, so the type is checked first.

use crate::DeviceError;

/// The refusal for `path` if it contains a `/` (a file path, not a bare name the dynamic
/// linker searches for) and names an existing file that is not a regular file (symlinks
/// followed). A missing file is left to the loader, whose message says so.
pub(crate) fn not_regular(path: &str) -> Option<DeviceError> {
    if !path.contains('/') {
        return None;
    }
    let ft = std::fs::metadata(path).ok()?.file_type();
    if ft.is_file() {
        return None;
    }
    Some(DeviceError::Library {
        library: path.to_owned(),
        symbol: None,
        reason: format!("is {}, not a regular file", ork_io::describe_kind(ft)),
    })
}
