use std::os::unix::process::ExitStatusExt;

use super::*;

fn exited(tail: &str) -> Error {
    Error::Exited {
        binary: "kube-controller-manager",
        status: ExitStatus::from_raw(1 << 8),
        tail: tail.into(),
    }
}

#[test]
fn only_a_taken_port_makes_a_start_again() {
    let taken = "E1126 run.go:72] \"command failed\" err=\"failed to create listener: failed \
                 to listen on 127.0.0.1:41487: listen tcp 127.0.0.1:41487: bind: address \
                 already in use\"";
    assert!(exited(taken).is_port_taken());
    assert!(!exited("unknown flag: --bogus").is_port_taken());
    assert!(!Error::Stopped.is_port_taken());
}
