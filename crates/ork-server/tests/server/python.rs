//! The official `openai` Python client (installed by `scripts/test.sh`) against the server.
use super::common::*;

#[test]
fn the_official_openai_python_client_works() {
    let server = start(1024, |c| c.api_key = Some("test-key".to_owned()));
    run_openai_script("openai_client.py", &server, "test-key");
}
