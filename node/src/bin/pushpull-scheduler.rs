//! `pushpull-scheduler`: see `pushpull-scheduler --help` and [`pushpull_node::cli`].

fn main() -> std::process::ExitCode {
    pushpull_node::cli::scheduler_main()
}
