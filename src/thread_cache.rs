//! jemalloc's thread cache, switched per thread. The binary runs with it on: without it the
//! controller spends about twice the CPU per claim. But indexes filled with it on hold about
//! 8 MiB more at 5,000 Nodes / 50,000 pods for the life of the process (a cache of two objects
//! per size class costs as much as the default one, so it is not what the cache holds), so the
//! controller switches it off on its own thread while the initial lists fill the indexes and
//! back on once they are synced, which costs no standing memory (docs/benchmarks.md).

/// Switch the calling thread's cache on or off; the setting it had, or None when jemalloc did
/// not answer.
#[cfg(not(feature = "system-allocator"))]
pub(crate) fn set(enabled: bool) -> Option<bool> {
    let mut value = enabled;
    let mut old = false;
    let mut old_len = std::mem::size_of::<bool>();
    // SAFETY: the name is a NUL-terminated string; `oldp`/`newp` point at `bool`s of the sizes
    // given, the type jemalloc documents for `thread.tcache.enabled`.
    let rc = unsafe {
        tikv_jemalloc_sys::mallctl(
            c"thread.tcache.enabled".as_ptr(),
            (&raw mut old).cast(),
            &raw mut old_len,
            (&raw mut value).cast(),
            std::mem::size_of::<bool>(),
        )
    };
    (rc == 0).then_some(old)
}

/// Built for a heap profiler (`system-allocator`): jemalloc allocates nothing, so there is no
/// cache to switch and nothing to report.
#[cfg(feature = "system-allocator")]
pub(crate) fn set(_enabled: bool) -> Option<bool> {
    None
}

#[cfg(test)]
mod tests {
    use super::set;

    #[cfg(not(feature = "system-allocator"))]
    #[test]
    fn switches_the_calling_threads_cache_and_reports_what_it_was() {
        let before = set(false).expect("jemalloc answers mallctl");
        assert_eq!(set(true), Some(false));
        assert_eq!(set(before), Some(true));
    }

    #[cfg(feature = "system-allocator")]
    #[test]
    fn switches_nothing_without_jemalloc() {
        assert_eq!(set(false), None);
        assert_eq!(set(true), None);
    }
}
