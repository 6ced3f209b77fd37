//! A kubeconfig file pointing at the simulated server, so `kubectl --kubeconfig <path>` works.

use std::path::{Path, PathBuf};

use super::errors::SimError;

/// Writes `<dir>/kubeconfig` for `url` and returns its path.
pub fn write(dir: &Path, url: &str) -> Result<PathBuf, SimError> {
    let path = dir.join("kubeconfig");
    std::fs::create_dir_all(dir).map_err(|source| SimError::Kubeconfig {
        path: path.display().to_string(),
        source,
    })?;
    write_file(&path, url)?;
    Ok(path)
}

/// Writes a kubeconfig for `url` at `path` (its directory must exist), replacing any file there.
pub fn write_file(path: &Path, url: &str) -> Result<(), SimError> {
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: sim\n  cluster:\n    server: {url}\ncontexts:\n- name: sim\n  context:\n    cluster: sim\n    user: sim\n    namespace: default\ncurrent-context: sim\nusers:\n- name: sim\n  user:\n    token: sim\npreferences: {{}}\n"
    );
    std::fs::write(path, text).map_err(|source| SimError::Kubeconfig {
        path: path.display().to_string(),
        source,
    })
}
