//! `voidbox lsp`: a language server for voidbox specs over stdio, built on `voidbox-spec`
//! (no VMM, no runtime).
//!
//! It publishes exactly `voidbox validate`'s diagnostics (same validation, same codes,
//! ranges and help) when a file is opened and after every edit (synced incrementally), none
//! for a YAML file that is not a spec (`validate <dir>`'s rule), and answers hover (the
//! field's schema description and accepted values), completion (field names the mapping
//! takes, enumeration values), go-to-definition (from a box or step name in `stages`,
//! `depends_on`, `stdin_from` or `output_step` to its box or step) and document symbols
//! (sections, boxes, steps, stages).
//!
//! | module | owns |
//! |---|---|
//! | [`server`] | the loop, capabilities, documents, `file:` URIs |
//! | [`document`] | byte offsets ⇄ LSP positions (UTF-16), ranged edits |
//! | [`path`] | the cursor as a YAML path (parsed tree, or indentation and flow collections while typing) |
//! | [`schema_nav`] | the JSON Schema walked along a path |
//! | [`diagnostics`], [`hover`], [`completion`], [`definition`], [`symbols`] | the features |

pub mod completion;
pub mod definition;
pub mod diagnostics;
pub mod document;
pub mod hover;
pub mod path;
pub mod schema_nav;
pub mod server;
pub mod symbols;

use voidbox_spec::validate::HostFacts;

/// Serves the language server protocol on stdin/stdout until the client exits.
pub fn run_stdio(facts: HostFacts<'_>) -> Result<(), Box<dyn std::error::Error>> {
    let (conn, io) = lsp_server::Connection::stdio();
    server::serve(&conn, facts)?;
    drop(conn);
    io.join()?;
    Ok(())
}
