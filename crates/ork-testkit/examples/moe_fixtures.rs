//! Make (or find) the cached MoE fixtures and print their paths, one `NAME PATH` a line
//! (scripts/moe_golden.py reads them).
fn main() {
    for kind in ork_testkit::moe::MoeFixture::ALL {
        let path = ork_testkit::moe::moe_fixture(kind);
        println!("{} {}", kind.name(), path.display());
    }
}
