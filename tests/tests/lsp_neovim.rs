//! `voidbox lsp` in a real editor: Neovim (Debian's, headless) starts it with its built-in
//! LSP client, opens an invalid spec, and reports what it received — the diagnostics, a
//! hover and a definition jump — which must be what `voidbox validate` says and where the
//! box is. Needs `nvim` (`apt-get install -y neovim`; `scripts/test.sh` installs it).

use std::path::Path;
use std::process::Command;

use serde_json::Value;

const VOIDBOX: &str = env!("CARGO_BIN_EXE_voidbox-under-test");

const SPEC: &str = "api_version: v1
kind: pipeline
name: p
pipeline:
  boxes:
    - name: seed
      run: {program: sh, args: [-c, 'echo 1']}
      timeout_sec: 5
    - name: count
      run: {program: wc}
  stages:
    - {type: box, name: seed}
    - {type: box, name: count}
";

/// The editor's side: attach the server, wait for diagnostics, ask for a hover on `program`
/// (line 6) and a definition of the stage's `count` (line 12), write it all as JSON.
const SCRIPT: &str = r#"
local ok, err = pcall(function()
  local file, out = os.getenv('SPEC'), os.getenv('OUT')
  vim.cmd('edit ' .. file)
  local buf = vim.api.nvim_get_current_buf()
  local id = vim.lsp.start_client({
    name = 'voidbox',
    cmd = { os.getenv('VOIDBOX'), 'lsp' },
    root_dir = vim.fn.fnamemodify(file, ':h'),
  })
  assert(id, 'the client did not start')
  vim.lsp.buf_attach_client(buf, id)
  assert(vim.wait(30000, function() return #vim.diagnostic.get(buf) > 0 end, 50),
    'no diagnostics within 30 s')
  local uri = vim.uri_from_bufnr(buf)
  local function ask(method, line, character)
    local r = vim.lsp.buf_request_sync(buf, method,
      { textDocument = { uri = uri }, position = { line = line, character = character } }, 10000)
    assert(r and r[id], method .. ': no answer')
    return r[id].result
  end
  local result = {
    diagnostics = vim.diagnostic.get(buf),
    hover = ask('textDocument/hover', 6, 14),
    definition = ask('textDocument/definition', 12, 26),
  }
  local f = assert(io.open(out, 'w'))
  f:write(vim.fn.json_encode(result))
  f:close()
end)
if not ok then
  io.stderr:write('lsp test: ' .. tostring(err) .. '\n')
  vim.cmd('cquit 1')
end
vim.cmd('qall!')
"#;

fn nvim() -> &'static str {
    let path = "/usr/bin/nvim";
    assert!(
        Path::new(path).is_file(),
        "{path} missing: apt-get install -y neovim (scripts/test.sh installs it)"
    );
    path
}

#[test]
fn neovim_receives_validate_s_diagnostics_a_hover_and_a_definition() {
    let dir = tempfile::tempdir().unwrap();
    let spec = voidbox_tests::write_file(dir.path(), "p.yaml", SPEC);
    let script = voidbox_tests::write_file(dir.path(), "lsp.lua", SCRIPT);
    let out = dir.path().join("out.json");
    let run = Command::new(nvim())
        .args(["--headless", "-u", "NONE", "-i", "NONE", "-n", "-c"])
        .arg(format!("luafile {script}"))
        .env("SPEC", &spec)
        .env("OUT", &out)
        .env("VOIDBOX", VOIDBOX)
        .env("HOME", dir.path())
        .env("XDG_STATE_HOME", dir.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "nvim: {:?}\n{stderr}", run.status);
    let got: Value = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();

    // What `voidbox validate --format json` reports for the same file.
    let v = Command::new(VOIDBOX)
        .args(["validate", "--format", "json"])
        .arg(&spec)
        .output()
        .unwrap();
    let report: Value = serde_json::from_slice(&v.stdout).unwrap();
    let want: Vec<(String, u64, u64)> = report["files"][0]["diagnostics"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| {
            (
                d["code"].as_str().unwrap().to_string(),
                d["line"].as_u64().unwrap() - 1,
                d["column"].as_u64().unwrap() - 1,
            )
        })
        .collect();
    let diags = got["diagnostics"].as_array().unwrap();
    let mut have: Vec<(String, u64, u64)> = diags
        .iter()
        .map(|d| {
            let code = d["code"]
                .as_str()
                .or_else(|| d["user_data"]["lsp"]["code"].as_str())
                .unwrap_or_default()
                .to_string();
            (
                code,
                d["lnum"].as_u64().unwrap(),
                d["col"].as_u64().unwrap(),
            )
        })
        .collect();
    have.sort();
    let mut want = want;
    want.sort();
    assert!(!want.is_empty());
    assert_eq!(have, want, "neovim: {diags:?}");
    assert!(
        diags
            .iter()
            .any(|d| d["message"].as_str().unwrap_or("").contains("timeout_secs")),
        "{diags:?}"
    );
    let hover = got["hover"]["contents"]["value"]
        .as_str()
        .unwrap_or_default();
    assert!(hover.contains("Program name"), "hover: {}", got["hover"]);
    let def = &got["definition"];
    assert!(
        def["uri"].as_str().unwrap_or_default().ends_with("/p.yaml"),
        "definition: {def}"
    );
    assert_eq!(def["range"]["start"]["line"], 8, "the `count` box: {def}");
}
