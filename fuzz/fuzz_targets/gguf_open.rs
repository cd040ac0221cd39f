//! Parse arbitrary bytes as a GGUF file; decode every tensor of those that parse.
//! Any panic (or out-of-memory) is a bug: bad input must come back as a `GgufError`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ork_gguf::GgufFile;

fuzz_target!(|data: &[u8]| {
    let Ok(file) = GgufFile::from_bytes("fuzz.gguf", data.to_vec()) else {
        return;
    };
    for (key, value) in file.metadata_iter() {
        assert!(file.metadata(key).is_some());
        let _ = (
            value.as_u64(),
            value.as_f32(),
            value.as_str(),
            value.as_array(),
        );
    }
    for t in file.tensors() {
        assert_eq!(file.tensor(&t.name), Some(t));
        assert_eq!(file.tensor_data(t).len() as u64, t.size);
        let _ = file.dequantize_tensor(t);
    }
});
