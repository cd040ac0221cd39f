//! Which files a pack write may replace (`resolve_target`, used by `ensure`, `convert` and the
//! writer): never the model under any spelling or link, never a file that is not an `.orkpack`,
//! never a FIFO/device/directory; symlinks are written through.

use std::os::unix::fs::{symlink, FileTypeExt};
use std::path::{Path, PathBuf};

use ork_gguf::{GgufError, GgufFile};
use ork_pack::PackDtype;
use ork_store::{convert, ensure, resolve_target, ConvertOptions, Orkpack, StoreError};

use super::gguf_model::write_tiny_gguf;

fn model_in(dir: &Path) -> PathBuf {
    let p = dir.join("m.gguf");
    let w: Vec<f32> = (0..64 * 32).map(|i| (i % 13) as f32 - 6.0).collect();
    write_tiny_gguf(&p, &[("blk.0.attn_q.weight", vec![64, 32], w)]);
    p
}

fn opts() -> ConvertOptions<'static> {
    ConvertOptions::new(PackDtype::I8)
}

fn mkfifo(path: &Path) {
    rustix::fs::mknodat(
        rustix::fs::CWD,
        path,
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o644),
        0,
    )
    .unwrap();
}

#[test]
fn the_model_is_never_a_pack_target_under_any_spelling() {
    let dir = tempfile::tempdir().unwrap();
    let model_path = model_in(dir.path());
    let original = std::fs::read(&model_path).unwrap();
    let sub = dir.path().join("sub");
    std::fs::create_dir(&sub).unwrap();
    let sym = dir.path().join("link.orkpack");
    symlink(&model_path, &sym).unwrap();
    let hard = dir.path().join("hard.orkpack");
    std::fs::hard_link(&model_path, &hard).unwrap();
    let spellings = [
        model_path.clone(),
        sub.join("../m.gguf"),
        dir.path().join("./m.gguf"),
        sym,
        hard,
    ];
    let model = GgufFile::open(&model_path).unwrap();
    for p in &spellings {
        let e = ensure(&model, p, &opts()).unwrap_err();
        assert!(
            matches!(e, StoreError::WouldOverwriteModel { .. }),
            "{}: {e:?}",
            p.display()
        );
        let e = convert(&model, p, &opts()).unwrap_err();
        assert!(
            matches!(e, StoreError::WouldOverwriteModel { .. }),
            "{}: {e:?}",
            p.display()
        );
    }
    // Opened under a relative-looking spelling too.
    let model2 = GgufFile::open(&sub.join("../m.gguf")).unwrap();
    let e = ensure(&model2, &model_path, &opts()).unwrap_err();
    assert!(matches!(e, StoreError::WouldOverwriteModel { .. }), "{e:?}");
    assert_eq!(std::fs::read(&model_path).unwrap(), original);
    assert!(std::fs::symlink_metadata(dir.path().join("link.orkpack"))
        .unwrap()
        .file_type()
        .is_symlink());
}

#[test]
fn a_file_that_is_not_a_pack_is_never_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let model = GgufFile::open(&model_in(dir.path())).unwrap();
    let notes = dir.path().join("notes.txt");
    std::fs::write(&notes, b"my notes\n").unwrap();
    for e in [
        ensure(&model, &notes, &opts()).unwrap_err(),
        convert(&model, &notes, &opts()).unwrap_err(),
        ork_store::OrkpackWriter::create(&notes).unwrap_err(),
    ] {
        assert!(matches!(e, StoreError::RefuseOverwrite { .. }), "{e:?}");
    }
    assert_eq!(std::fs::read(&notes).unwrap(), b"my notes\n");
    // An empty file holds nothing to lose: it becomes the pack.
    let empty = dir.path().join("empty.orkpack");
    std::fs::write(&empty, b"").unwrap();
    let (_, r) = ensure(&model, &empty, &opts()).unwrap();
    assert_eq!(r.rebuild, Some(ork_store::RebuildReason::Empty));
    assert!(Orkpack::open(&empty).is_ok());
}

#[test]
fn fifos_devices_and_directories_are_refused_without_blocking() {
    let dir = tempfile::tempdir().unwrap();
    let model_path = model_in(dir.path());
    let model = GgufFile::open(&model_path).unwrap();
    let fifo = dir.path().join("p.orkpack");
    mkfifo(&fifo);
    let d = dir.path().join("d.orkpack");
    std::fs::create_dir(&d).unwrap();
    for target in [&fifo, &d, &PathBuf::from("/dev/null")] {
        let e = ensure(&model, target, &opts()).unwrap_err();
        assert!(
            matches!(e, StoreError::NotRegularFile { .. }),
            "{}: {e:?}",
            target.display()
        );
        let e = Orkpack::open(target).unwrap_err();
        assert!(
            matches!(e, StoreError::NotRegularFile { .. }),
            "{}: {e:?}",
            target.display()
        );
    }
    assert!(std::fs::metadata(&fifo).unwrap().file_type().is_fifo());
    // The same for the model.
    let gfifo = dir.path().join("p.gguf");
    mkfifo(&gfifo);
    for p in [&gfifo, &d] {
        let e = GgufFile::open(p).unwrap_err();
        assert!(matches!(e, GgufError::NotRegularFile { .. }), "{e:?}");
    }
}

#[test]
fn a_symlinked_pack_is_written_through() {
    let dir = tempfile::tempdir().unwrap();
    let model = GgufFile::open(&model_in(dir.path())).unwrap();
    let real_dir = dir.path().join("real");
    std::fs::create_dir(&real_dir).unwrap();
    let real = real_dir.join("m.orkpack");
    let link = dir.path().join("m.orkpack");
    // A link to a file that does not exist: refused.
    symlink(&real, &link).unwrap();
    let e = ensure(&model, &link, &opts()).unwrap_err();
    assert!(matches!(e, StoreError::RefuseOverwrite { .. }), "{e:?}");
    // Once the file exists (built through its own path), the link is written through.
    ensure(&model, &real, &opts()).unwrap();
    let t = resolve_target(&link, Some(model.path())).unwrap();
    assert_eq!(t.path, std::fs::canonicalize(&real).unwrap());
    let (_, r) = convert(&model, &link, &opts()).unwrap();
    assert!(r.rewritten);
    assert!(std::fs::symlink_metadata(&link)
        .unwrap()
        .file_type()
        .is_symlink());
    assert!(Orkpack::open(&real).is_ok());
    // Only the pack and nothing else in either directory (no temp left behind).
    assert_eq!(std::fs::read_dir(&real_dir).unwrap().count(), 1);
}

#[test]
fn a_new_target_resolves_to_its_canonical_directory() {
    let dir = tempfile::tempdir().unwrap();
    let sub = dir.path().join("sub");
    std::fs::create_dir(&sub).unwrap();
    let t = resolve_target(&sub.join("../new.orkpack"), None).unwrap();
    assert!(!t.exists);
    assert_eq!(
        t.path,
        std::fs::canonicalize(dir.path())
            .unwrap()
            .join("new.orkpack")
    );
    let e = resolve_target(&dir.path().join("nodir/new.orkpack"), None).unwrap_err();
    assert!(matches!(e, StoreError::Io { .. }), "{e:?}");
}

#[test]
fn a_non_finite_scale_with_a_valid_checksum_is_refused_naming_the_tensor() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nan.orkpack");
    let mut w = super::weight(PackDtype::I8, 64, 32, 7);
    w.scales[5] = f32::NAN;
    let source = ork_store::SourceInfo {
        fingerprint: 1,
        ggml_type: 0,
    };
    let mut writer = ork_store::OrkpackWriter::create(&path).unwrap();
    writer
        .add("good", &super::weight(PackDtype::I8, 64, 32, 8), source)
        .unwrap();
    writer.add("bad", &w, source).unwrap();
    writer.finish().unwrap();
    let pack = Orkpack::open(&path).unwrap();
    assert!(pack.verify(pack.entry("good").unwrap()).is_ok());
    for e in [
        pack.verify(pack.entry("bad").unwrap()).unwrap_err(),
        pack.load("bad", true).unwrap_err(),
    ] {
        match e {
            StoreError::CorruptBlob { tensor, .. } => assert_eq!(tensor, "bad"),
            other => panic!("expected CorruptBlob, got {other:?}"),
        }
    }
}

/// A finite scale no packer writes (3e38, beyond ±MAX_SCALE) with a valid checksum makes every
/// activation infinite: plain `verify`, `scales` and `load` refuse it as a corrupt entry
/// (which `ensure` and a streamed run repack), naming the tensor; MAX_SCALE itself passes.
#[test]
fn a_huge_scale_with_a_valid_checksum_is_refused_as_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("huge.orkpack");
    let source = ork_store::SourceInfo {
        fingerprint: 1,
        ggml_type: 0,
    };
    let mut huge = super::weight(PackDtype::I8, 64, 32, 7);
    huge.scales[3] = 3e38;
    let mut negative = super::weight(PackDtype::I8, 64, 32, 9);
    negative.scales[0] = -1e6;
    let mut edge = super::weight(PackDtype::I8, 64, 32, 8);
    edge.scales[1] = ork_pack::MAX_SCALE;
    let mut writer = ork_store::OrkpackWriter::create(&path).unwrap();
    writer.add("edge", &edge, source).unwrap();
    writer.add("huge", &huge, source).unwrap();
    writer.add("negative", &negative, source).unwrap();
    writer.finish().unwrap();
    let pack = Orkpack::open(&path).unwrap();
    assert!(pack.verify(pack.entry("edge").unwrap()).is_ok());
    for name in ["huge", "negative"] {
        let e = pack.entry(name).unwrap();
        for err in [
            pack.verify(e).unwrap_err(),
            pack.scales(e).unwrap_err(),
            pack.load(name, true).unwrap_err(),
        ] {
            match err {
                StoreError::CorruptBlob { tensor, .. } => assert_eq!(tensor, name),
                other => panic!("expected CorruptBlob, got {other:?}"),
            }
        }
    }
}

#[test]
fn an_unwritable_directory_is_a_write_failure() {
    // /proc/self accepts no new files, not even from root.
    let e = ork_store::OrkpackWriter::create(Path::new("/proc/self/x.orkpack")).unwrap_err();
    assert!(e.is_write_failure(), "{e:?}");
    let dir = tempfile::tempdir().unwrap();
    let notes = dir.path().join("notes.txt");
    std::fs::write(&notes, b"x").unwrap();
    let e = ork_store::OrkpackWriter::create(&notes).unwrap_err();
    assert!(!e.is_write_failure(), "{e:?}");
}
