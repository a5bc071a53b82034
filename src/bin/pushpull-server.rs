//! `pushpull-server`: see `pushpull-server --help` and [`pushpull::cli`].

fn main() -> std::process::ExitCode {
    pushpull::cli::server_main()
}
