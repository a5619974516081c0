//! `voidbox lsp` in a real editor: Neovim (Debian's, headless) with the documented setup
//! snippet as its `ftplugin/yaml.lua` (taken from docs/cli.md, so the two cannot drift apart)
//! opens an invalid spec. The snippet must attach the server to the buffer by itself (on
//! Neovim 0.7 `vim.lsp.start_client` alone never does). The editor then reports what it
//! received — the diagnostics, a hover, a definition jump, and the diagnostics after
//! incremental edits around non-ASCII text — which must be what `voidbox validate` says and
//! where the box is. Needs `nvim` (`apt-get install -y neovim`; `scripts/test.sh` installs it).

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

/// The editor's side, after the documented snippet ran as the yaml ftplugin: wait for the
/// voidbox client to be attached and for diagnostics, ask for a hover on `program` (line 6)
/// and a definition of the stage's `count` (line 12), then edit the buffer (incremental
/// sync: Neovim sends UTF-16 ranges) and record the diagnostics after each edit; write it all
/// as JSON.
const SCRIPT: &str = r#"
local ok, err = pcall(function()
  local file, out = os.getenv('SPEC'), os.getenv('OUT')
  vim.o.hidden = true
  vim.cmd('filetype plugin on')
  vim.cmd('edit ' .. file)
  local buf = vim.api.nvim_get_current_buf()
  assert(vim.bo[buf].filetype == 'yaml', 'filetype: ' .. vim.bo[buf].filetype)
  local clients = vim.lsp.get_clients or vim.lsp.get_active_clients
  local function attached(b)
    for _, c in ipairs(clients()) do
      if c.name == 'voidbox' and vim.lsp.buf_is_attached(b, c.id) then return c.id end
    end
  end
  local id
  assert(vim.wait(10000, function() id = attached(buf); return id ~= nil end, 50),
    'the documented snippet attached no voidbox client to the buffer')
  assert(vim.wait(30000, function() return #vim.diagnostic.get(buf) > 0 end, 50),
    'no diagnostics within 30 s')
  local uri = vim.uri_from_bufnr(buf)
  local function ask(method, line, character)
    local r = vim.lsp.buf_request_sync(buf, method,
      { textDocument = { uri = uri }, position = { line = line, character = character } }, 10000)
    assert(r and r[id], method .. ': no answer')
    return r[id].result
  end
  local function settle(what, want)
    assert(vim.wait(10000, function() return want(#vim.diagnostic.get(buf)) end, 50),
      what .. ': ' .. vim.inspect(vim.diagnostic.get(buf)))
    return vim.diagnostic.get(buf)
  end
  local result = {
    sync = vim.lsp.get_client_by_id(id).server_capabilities.textDocumentSync,
    diagnostics = vim.diagnostic.get(buf),
    hover = ask('textDocument/hover', 6, 14),
    definition = ask('textDocument/definition', 12, 26),
  }
  -- `timeout_sec` becomes `timeout_secs`: nothing left.
  vim.api.nvim_buf_set_text(buf, 7, 17, 7, 17, { 's' })
  settle('after fixing timeout_sec', function(n) return n == 0 end)
  -- The stage names `é𝄞count` (6 bytes, 3 UTF-16 units before `count`): no such box.
  vim.api.nvim_buf_set_text(buf, 12, 24, 12, 24, { 'é𝄞' })
  result.unicode = settle('after naming é𝄞count', function(n) return n > 0 end)
  -- Both characters removed again, by their byte range here, UTF-16 on the wire.
  vim.api.nvim_buf_set_text(buf, 12, 24, 12, 30, {})
  settle('after removing é𝄞', function(n) return n == 0 end)
  -- A second spec is attached to the same client.
  vim.cmd('edit ' .. os.getenv('SECOND'))
  local second = vim.api.nvim_get_current_buf()
  assert(vim.wait(10000, function() return attached(second) ~= nil end, 50),
    'the second yaml buffer was not attached')
  assert(vim.wait(10000, function() return #vim.diagnostic.get(second) > 0 end, 50),
    'no diagnostics for the second spec')
  local n = 0
  for _, c in ipairs(clients()) do
    if c.name == 'voidbox' then n = n + 1 end
  end
  result.clients = n
  result.same_client = attached(second) == id
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

/// The documented Neovim setup: the `lua` block of the `voidbox lsp` section of docs/cli.md.
fn readme_snippet() -> String {
    let doc = std::fs::read_to_string(voidbox_tests::repo_root().join("docs/cli.md"))
        .expect("docs/cli.md");
    let section = doc
        .split("\n## `voidbox lsp`")
        .nth(1)
        .expect("docs/cli.md has a `voidbox lsp` section");
    let section = section.split("\n## ").next().unwrap_or(section);
    let block = section
        .split("```lua\n")
        .nth(1)
        .and_then(|b| b.split("\n```").next())
        .expect("the `voidbox lsp` section has a ```lua block");
    assert!(
        block.contains("vim.lsp.start") && block.contains("buf_attach_client"),
        "{block}"
    );
    block.to_string()
}

fn nvim() -> &'static str {
    let path = "/usr/bin/nvim";
    assert!(
        Path::new(path).is_file(),
        "{path} missing: apt-get install -y neovim (scripts/test.sh installs it)"
    );
    path
}

#[test]
fn the_readme_s_neovim_setup_attaches_and_gets_diagnostics_hover_definition_and_edits() {
    let dir = tempfile::tempdir().unwrap();
    let spec = voidbox_tests::write_file(dir.path(), "p.yaml", SPEC);
    let second = voidbox_tests::write_file(dir.path(), "q.yaml", SPEC);
    let script = voidbox_tests::write_file(dir.path(), "lsp.lua", SCRIPT);
    // The documented snippet as the user's ftplugin, running `voidbox` from PATH.
    let config = dir.path().join("config");
    let ftplugin = config.join("nvim/ftplugin");
    std::fs::create_dir_all(&ftplugin).unwrap();
    voidbox_tests::write_file(&ftplugin, "yaml.lua", &readme_snippet());
    let bin = dir.path().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::os::unix::fs::symlink(VOIDBOX, bin.join("voidbox")).unwrap();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = dir.path().join("out.json");
    let run = Command::new(nvim())
        .args(["--headless", "-i", "NONE", "-n", "-c"])
        .arg(format!("luafile {script}"))
        .env("SPEC", &spec)
        .env("SECOND", &second)
        .env("OUT", &out)
        .env("PATH", path)
        .env("HOME", dir.path())
        .env("XDG_CONFIG_HOME", &config)
        .env("XDG_DATA_HOME", dir.path().join("data"))
        .env("XDG_STATE_HOME", dir.path())
        .env_remove("VIMINIT")
        .env_remove("NVIM_APPNAME")
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
    assert_eq!(got["sync"], 2, "incremental sync");
    // The unknown box `é𝄞count`: located at its name (a byte column in Neovim, which turned
    // the server's UTF-16 position back into bytes).
    let unicode = got["unicode"].as_array().unwrap();
    assert!(
        unicode.iter().any(|d| d["lnum"] == 12 && d["col"] == 24),
        "after naming é𝄞count: {unicode:?}"
    );
    assert_eq!(got["clients"], 1, "one server for both buffers");
    assert_eq!(got["same_client"], true);
}
