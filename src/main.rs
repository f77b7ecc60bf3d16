use clap::Parser;

fn main() {
    // `allocbench replay ... | head` ends quietly, as command-line tools do, instead of panicking
    // in println! when the reader goes away (Rust ignores SIGPIPE by default).
    // SAFETY: restoring the default disposition of a signal before any thread starts.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    let cli = allocbench::cli::Cli::parse();
    std::process::exit(allocbench::cli::main_with(cli));
}
