//! The command lines (clap derive) of `pushpull-scheduler` and `pushpull-server`, their entry
//! points, and the exit codes every pushpull command uses: 0 success, 1 a failed run, 2 bad
//! input (clap's usage errors included). `pushpull scheduler|server` (the root package's
//! `pushpull` binary) take the same flags and run the same functions.

use std::process::ExitCode;

use clap::Parser;

use crate::commands::{run_scheduler, run_server, NodeArgs};
use crate::error::CliResult;
use crate::logging;

/// `pushpull-scheduler`: the rendezvous point of a cluster.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "pushpull-scheduler",
    version,
    about = "The pushpull scheduler: registers servers and workers, assigns ranks and tensor \
             placements, runs barriers and heartbeats, and ends the job.",
    long_about = None,
    after_help = "Prints `pushpull-scheduler listening on ADDR` once bound, and \
                  `pushpull-scheduler cpu_seconds S` at exit. Exit code 0 when every worker \
                  finished, 1 when a node was lost (the error names it), 2 for bad input."
)]
pub struct SchedulerArgs {
    #[command(flatten)]
    #[allow(missing_docs)]
    pub node: NodeArgs,
}

/// `pushpull-server`: holds a shard of the keys and sums pushes.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "pushpull-server",
    version,
    about = "A pushpull server: holds a shard of the keys, sums every round's pushes in rank \
             order and answers each worker.",
    after_help = "Prints `pushpull-server listening on ADDR` once bound, and \
                  `pushpull-server cpu_seconds S` at exit. Exit code 0 on a clean shutdown, 1 \
                  when the job failed (the error names the lost node), 2 for bad input."
)]
pub struct ServerArgs {
    #[command(flatten)]
    #[allow(missing_docs)]
    pub node: NodeArgs,
    /// The address to bind, IP:PORT (overrides `server.listen`; port 0 picks a free port).
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<String>,
}

/// Turns a command's result into the process exit code, printing the error on stderr.
pub fn exit(result: CliResult<()>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}

/// The multi-threaded tokio runtime a node command runs on.
pub fn multi_thread() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// Runs a scheduler (`pushpull-scheduler`, `pushpull scheduler`).
pub fn scheduler(args: SchedulerArgs) -> CliResult<()> {
    multi_thread().block_on(run_scheduler(&args.node))
}

/// Runs a server (`pushpull-server`, `pushpull server`).
pub fn server(args: ServerArgs) -> CliResult<()> {
    multi_thread().block_on(run_server(&args.node, args.listen.as_deref()))
}

/// Entry point of `pushpull-scheduler`.
pub fn scheduler_main() -> ExitCode {
    let args = SchedulerArgs::parse();
    logging::init();
    exit(scheduler(args))
}

/// Entry point of `pushpull-server`.
pub fn server_main() -> ExitCode {
    let args = ServerArgs::parse();
    logging::init();
    exit(server(args))
}
