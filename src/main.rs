//! `karpenter-capi`: parse the command line and run it.

use std::process::ExitCode;

use clap::Parser;
use karpenter_capi::cli::{Cli, Command};
use karpenter_capi::{api, app, explain, init};

/// jemalloc instead of glibc's malloc: the indexes are millions of small allocations, which its
/// size classes hold without a header each, and it returns freed pages instead of keeping them.
/// The `system-allocator` feature leaves the system's malloc in place, for heap profilers.
#[cfg(not(feature = "system-allocator"))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's options, read at its first allocation (`_RJEM_MALLOC_CONF` in the environment
/// overrides them). The thread cache is on (without it the controller's CPU per claim doubles;
/// the controller switches it off on its own thread while its indexes fill, `thread_cache`);
/// freed pages are returned at once rather than after ten seconds, so a burst of decoding
/// leaves no standing peak. A C string: the address of its first byte.
#[cfg(not(feature = "system-allocator"))]
#[unsafe(export_name = "_rjem_malloc_conf")]
static MALLOC_CONF: &u8 = &b"tcache:true,dirty_decay_ms:0,muzzy_decay_ms:0\0"[0];

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Version => {
            println!("karpenter-capi {}", env!("CARGO_PKG_VERSION"));
            ExitCode::SUCCESS
        }
        Command::Crds(args) => match args.output_dir {
            Some(dir) => report(
                api::crds::write_dir(&dir).map(|_| eprintln!("wrote CRDs to {}", dir.display())),
            ),
            None => report(api::crds::render_yaml().map(|y| print!("{y}"))),
        },
        Command::Explain(cmd) => print_or_fail(actix::System::new().block_on(explain::run(*cmd))),
        Command::Init(args) => print_or_fail(actix::System::new().block_on(init::run(&args))),
        Command::Run(args) => {
            if let Err(e) = app::init_logging(&args.log, "info") {
                eprintln!("error: {e}");
                return ExitCode::from(2);
            }
            let system = actix::System::new();
            let result = system.block_on(app::run(*args));
            karpenter_capi::logging::flush();
            report(result)
        }
        #[cfg(feature = "simulator")]
        Command::Simulate(args) => {
            if let Err(e) = app::init_logging(&args.log, "warn") {
                eprintln!("error: {e}");
                return ExitCode::from(2);
            }
            let result = karpenter_capi::simulate::run(*args);
            karpenter_capi::logging::flush();
            match result {
                Ok(ok) if ok => ExitCode::SUCCESS,
                Ok(_) => ExitCode::from(1),
                Err(e) => {
                    eprintln!("error: {e}");
                    ExitCode::from(1)
                }
            }
        }
    }
}

fn report<E: std::fmt::Display>(r: Result<(), E>) -> ExitCode {
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(1)
        }
    }
}

/// The read-only tools: the output on stdout and 0, or the error on stderr and 1.
fn print_or_fail<E: std::fmt::Display>(r: Result<String, E>) -> ExitCode {
    report(r.map(|out| print!("{out}")))
}
