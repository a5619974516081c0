//! `voidbox-llm-script SCRIPT.json [--addr IP:PORT] [--record FILE]`: serves the script
//! (see [`voidbox_llm_script::Script`]) until killed. Prints the port on stdout once
//! listening; `--record` appends every request as a JSON line.

use std::io::Write;
use std::net::SocketAddr;

use voidbox_llm_script::{Script, Server};

fn run() -> Result<(), String> {
    let mut args = std::env::args().skip(1);
    let mut script = None;
    let mut addr: SocketAddr = SocketAddr::from(([127, 0, 0, 1], 0));
    let mut record = None;
    while let Some(a) = args.next() {
        match a.as_str() {
            "--addr" => {
                let v = args.next().ok_or("--addr needs IP:PORT")?;
                addr = v.parse().map_err(|e| format!("--addr {v}: {e}"))?;
            }
            "--record" => record = Some(args.next().ok_or("--record needs a file")?),
            "-h" | "--help" => {
                println!("usage: voidbox-llm-script SCRIPT.json [--addr IP:PORT] [--record FILE]");
                return Ok(());
            }
            _ if script.is_none() && !a.starts_with('-') => script = Some(a),
            _ => return Err(format!("unexpected argument `{a}`")),
        }
    }
    let path =
        script.ok_or("usage: voidbox-llm-script SCRIPT.json [--addr IP:PORT] [--record FILE]")?;
    let data = std::fs::read(&path).map_err(|e| format!("{path}: {e}"))?;
    let script = Script::from_json(&data).map_err(|e| format!("{path}: {e}"))?;
    let record_to = match record {
        Some(f) => Some(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&f)
                .map_err(|e| format!("{f}: {e}"))?,
        ),
        None => None,
    };
    let server = Server::bind(addr, script, record_to).map_err(|e| format!("bind {addr}: {e}"))?;
    let mut out = std::io::stdout();
    let _ = writeln!(out, "{}", server.port());
    let _ = out.flush();
    loop {
        std::thread::park();
    }
}

fn main() {
    if let Err(e) = run() {
        eprintln!("voidbox-llm-script: {e}");
        std::process::exit(2);
    }
}
