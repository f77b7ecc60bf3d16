fn main() {
    // `allocbench replay ... | head` ends quietly, as command-line tools do, instead of panicking
    // in println! when the reader goes away (Rust ignores SIGPIPE by default).
    // SAFETY: restoring the default disposition of a signal before any thread starts.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    // A standard output that cannot be written (a full disk) fails println!, which panics: said
    // in one line instead, as the error of every other output is (results files are flushed
    // record by record, so what was written stays).
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let payload = info.payload();
        let message = payload.downcast_ref::<String>().map(String::as_str).or_else(|| payload.downcast_ref::<&str>().copied()).unwrap_or("");
        if let Some(why) = message.strip_prefix("failed printing to stdout: ") {
            eprintln!("error: standard output: cannot write: {why}");
            std::process::exit(1);
        }
        default_hook(info)
    }));
    let cli = allocbench::cli::parse_or_exit();
    std::process::exit(allocbench::cli::main_with(cli));
}
