//! Write the RoPE-factor and phi3 fixtures into the directory given as the only argument and
//! print their paths, one `NAME PATH` a line (scripts/rope_golden.py reads them).
fn main() {
    let dir = std::env::args_os()
        .nth(1)
        .expect("usage: rope_fixtures DIR");
    let dir = std::path::PathBuf::from(dir);
    std::fs::create_dir_all(&dir).expect("create the output directory");
    for kind in ork_testkit::rope::RopeFixture::ALL {
        let path = ork_testkit::rope::write_fixture(kind, &dir);
        println!("{} {}", kind.name(), path.display());
    }
}
