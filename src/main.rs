use clap::Parser;

fn main() {
    let cli = allocbench::cli::Cli::parse();
    std::process::exit(allocbench::cli::main_with(cli));
}
