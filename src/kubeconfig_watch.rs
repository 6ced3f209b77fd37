//! Notices when a kubeconfig file the clients were built from changes, so the controller can
//! restart with the new credentials.
//!
//! Cluster API rotates a workload cluster's `<cluster>-kubeconfig` Secret; the kubelet updates a
//! Secret volume (mounted without subPath) by swapping a symlink, within about a minute. A kube
//! Client reads its kubeconfig once, so a long-running controller would keep the old certificate
//! until it expires. Reading the file again on a timer and comparing its bytes sees every kind of
//! update (rename, symlink swap, write in place) with no platform-specific notification API; the
//! files are a few kilobytes and read every few seconds, which costs nothing measurable.

use std::path::{Path, PathBuf};
use std::time::Duration;

/// One file and the content it had when the clients were built (None: unreadable then).
#[derive(Debug)]
struct Watched {
    path: PathBuf,
    seen: Option<Vec<u8>>,
}

/// The kubeconfig files of one process, read every `every`.
#[derive(Debug)]
pub(crate) struct KubeconfigWatch {
    files: Vec<Watched>,
    every: Duration,
}

impl KubeconfigWatch {
    /// Takes each file's current content as its baseline. Call it before the clients are built
    /// from the files, so a change in between is seen as a change, not taken as the baseline.
    pub(crate) fn new(paths: impl IntoIterator<Item = PathBuf>, every: Duration) -> Self {
        let files = paths
            .into_iter()
            .map(|path| {
                let seen = std::fs::read(&path).ok();
                Watched { path, seen }
            })
            .collect();
        Self { files, every }
    }

    /// One look at every file: the first whose content differs from its baseline. A file that
    /// cannot be read is not a change (the kubelet keeps the last content when a Secret is
    /// deleted; a read error is most likely transient): it is logged and looked at again next
    /// time. A file unreadable at the start takes its first readable content as its baseline.
    pub(crate) fn check(&mut self) -> Option<&Path> {
        for f in &mut self.files {
            // A blocking read: a few kilobytes from a local volume, every few seconds.
            match std::fs::read(&f.path) {
                Ok(now) => match &f.seen {
                    Some(seen) if *seen != now => return Some(&f.path),
                    Some(_) => {}
                    None => f.seen = Some(now),
                },
                Err(e) => {
                    tracing::warn!(path = %f.path.display(), error = %e, "cannot read the kubeconfig to see whether it changed");
                }
            }
        }
        None
    }

    /// Resolves with the path of the first file that changes; never when there is nothing to
    /// watch or the interval is zero (checking turned off).
    pub(crate) async fn changed(mut self) -> PathBuf {
        if self.files.is_empty() || self.every.is_zero() {
            return std::future::pending().await;
        }
        let mut tick = tokio::time::interval(self.every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // The first tick is immediate; the baseline was just read.
        tick.tick().await;
        loop {
            tick.tick().await;
            if let Some(p) = self.check() {
                return p.to_path_buf();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FAST: Duration = Duration::from_millis(20);

    #[tokio::test]
    async fn an_unchanged_file_is_no_change_and_a_rewritten_one_is() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("kubeconfig");
        std::fs::write(&file, "apiVersion: v1\n").unwrap();
        let mut w = KubeconfigWatch::new([file.clone()], FAST);
        assert_eq!(w.check(), None);
        std::fs::write(&file, "apiVersion: v1\n").unwrap();
        assert_eq!(w.check(), None, "same bytes written again");
        std::fs::write(&file, "apiVersion: v1\n# rotated\n").unwrap();
        assert_eq!(w.check(), Some(file.as_path()));
    }

    /// The kubelet's atomic update of a Secret volume: the file is a symlink into a data
    /// directory, and the update points the data symlink at a new directory.
    #[cfg(unix)]
    #[tokio::test]
    async fn a_secret_volume_update_by_symlink_swap_is_a_change() {
        use std::os::unix::fs::symlink;
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::create_dir(d.join("..2025_01")).unwrap();
        std::fs::write(d.join("..2025_01/value"), "old").unwrap();
        symlink("..2025_01", d.join("..data")).unwrap();
        symlink("..data/value", d.join("value")).unwrap();
        let file = d.join("value");
        let watch = KubeconfigWatch::new([file.clone()], FAST);
        let changed = tokio::spawn(watch.changed());
        tokio::time::sleep(FAST * 3).await;
        assert!(!changed.is_finished(), "nothing changed yet");
        std::fs::create_dir(d.join("..2025_02")).unwrap();
        std::fs::write(d.join("..2025_02/value"), "new").unwrap();
        symlink("..2025_02", d.join("..data_tmp")).unwrap();
        std::fs::rename(d.join("..data_tmp"), d.join("..data")).unwrap();
        let seen = tokio::time::timeout(Duration::from_secs(5), changed)
            .await
            .expect("the swap is seen")
            .unwrap();
        assert_eq!(seen, file);
    }

    #[tokio::test]
    async fn an_unreadable_file_is_not_a_change_and_one_unreadable_at_first_gets_a_baseline() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("kubeconfig");
        std::fs::write(&file, "a").unwrap();
        let late = dir.path().join("late");
        let mut w = KubeconfigWatch::new([file.clone(), late.clone()], FAST);
        std::fs::remove_file(&file).unwrap();
        assert_eq!(w.check(), None, "gone for a moment");
        std::fs::write(&file, "a").unwrap();
        std::fs::write(&late, "first").unwrap();
        assert_eq!(w.check(), None, "the first content read is the baseline");
        std::fs::write(&late, "second").unwrap();
        assert_eq!(w.check(), Some(late.as_path()));
    }

    #[tokio::test]
    async fn nothing_to_watch_or_a_zero_interval_never_resolves() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("kubeconfig");
        std::fs::write(&file, "a").unwrap();
        for w in [
            KubeconfigWatch::new([], FAST),
            KubeconfigWatch::new([file.clone()], Duration::ZERO),
        ] {
            let changed = tokio::spawn(w.changed());
            std::fs::write(&file, "b").unwrap();
            tokio::time::sleep(FAST * 3).await;
            assert!(!changed.is_finished());
            changed.abort();
        }
    }
}
