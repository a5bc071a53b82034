//! `pushpull-server`: see `pushpull-server --help` and [`pushpull_node::cli`].

fn main() -> std::process::ExitCode {
    pushpull_node::cli::server_main()
}
