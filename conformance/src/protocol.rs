//! The JSON-lines stdio engine protocol (PROTOCOL.md): the harness side (`AdapterEngine`,
//! which drives any program speaking it) and the engine side (`serve`, which puts any
//! `Engine` — the built-in reference in `ds41 serve-adapter` — behind it).
//!
//! One JSON object per line each way. The harness sends `{"id": N, "op": ..., ...}`; the
//! engine answers `{"id": N, "ok": true, "result": {...}}` or
//! `{"id": N, "ok": false, "error": {"kind": "refused"|"unsupported"|"failed", "message": ...}}`.
//! The first request is `hello`; the answer declares the engine and its capabilities.

use std::collections::BTreeSet;
use std::io::{BufRead, Write};
use std::process::Command;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::engine_api::*;
use crate::engine_process::{
    describe_status, utf8_problem, EngineProcess, ReadError, MAX_REPLY_BYTES,
};

pub const PROTOCOL_VERSION: &str = "ds41-engine/1";
/// How long the first `hello` of a run may take by default (an engine may load a framework
/// first); `ds41 certify --hello-timeout` changes it.
pub const DEFAULT_HELLO_TIMEOUT: Duration = Duration::from_secs(60);

/// A request as it travels (the `id` is added by the envelope).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    Hello { protocol: String },
    Load(LoadRequest),
    Tokenize(TokenizeRequest),
    Render(RenderRequest),
    Parse(ParseRequest),
    Forward(ForwardRequest),
    EngramHash(EngramHashRequest),
    Dspark(DsparkRequest),
    VisionPreprocess(VisionPreprocessRequest),
    VisionTower(VisionTowerRequest),
    VisionSpan(VisionSpanRequest),
    Shutdown,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Envelope {
    id: u64,
    #[serde(flatten)]
    request: Request,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Reply {
    id: u64,
    ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    result: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    error: Option<ReplyError>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct ReplyError {
    kind: String,
    message: String,
    /// With `kind: unsupported`: the capability the engine lacks (PROTOCOL.md); `message` is
    /// then free text. Without it the capability is the message's first word.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    capability: Option<String>,
}

impl ReplyError {
    /// The lacking capability and the engine's reason of an `unsupported` reply: the
    /// structured `capability` field, else the message's leading name (`trace.topk`,
    /// `trace.topk: why`, `trace.topk why`). None when neither names a known capability.
    fn unsupported(&self) -> Option<(Capability, Option<String>)> {
        let reason = |r: &str| {
            let r = r.trim();
            (!r.is_empty()).then(|| r.to_string())
        };
        if let Some(name) = &self.capability {
            return Capability::parse(name.trim()).map(|c| (c, reason(&self.message)));
        }
        let m = self.message.trim();
        let end = m
            .find(|ch: char| ch == ':' || ch.is_whitespace())
            .unwrap_or(m.len());
        let rest = m[end..].trim_start().trim_start_matches(':');
        Capability::parse(&m[..end]).map(|c| (c, reason(rest)))
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Hello {
    pub protocol: String,
    pub engine: EngineIdentity,
    pub capabilities: Vec<String>,
}

// ------------------------------------------------------------------------- harness side

struct Running {
    process: EngineProcess,
    hello: Hello,
}

/// An engine behind the protocol, run as `sh -c COMMAND` in its own process group (see
/// `engine_process`). Restarted after a crash, a timeout or garbage, so one bad case never
/// takes the rest of the run with it.
pub struct AdapterEngine {
    command: String,
    running: Option<Running>,
    next_id: u64,
    identity: EngineIdentity,
    capabilities: BTreeSet<Capability>,
    /// Capabilities the engine named that this harness does not know (reported, ignored).
    pub unknown_capabilities: Vec<String>,
}

impl AdapterEngine {
    /// Start the engine and perform the hello; an engine that cannot even say hello is a
    /// configuration error.
    pub fn start(command: &str) -> anyhow::Result<AdapterEngine> {
        Self::start_within(command, DEFAULT_HELLO_TIMEOUT)
    }

    /// [`AdapterEngine::start`] with the first hello bounded by `hello_timeout`.
    pub fn start_within(command: &str, hello_timeout: Duration) -> anyhow::Result<AdapterEngine> {
        let mut e = AdapterEngine {
            command: command.to_string(),
            running: None,
            next_id: 1,
            identity: EngineIdentity {
                name: String::new(),
                version: String::new(),
                commit: None,
                driver: String::new(),
            },
            capabilities: BTreeSet::new(),
            unknown_capabilities: Vec::new(),
        };
        e.ensure_running(Instant::now() + hello_timeout, hello_timeout)
            .map_err(|err| {
                anyhow::anyhow!("engine `{command}`: {err} (the first hello; see --hello-timeout)")
            })?;
        Ok(e)
    }

    /// Start the engine and say hello, before `deadline` (`timeout` names it in a report).
    fn spawn(&mut self, deadline: Instant, timeout: Duration) -> Result<Running, EngineError> {
        let process = EngineProcess::spawn(Command::new("sh").arg("-c").arg(&self.command), true)
            .map_err(|e| {
            EngineError::Crashed(format!("cannot start `{}`: {e}", self.command))
        })?;
        let mut running = Running {
            process,
            hello: Hello {
                protocol: String::new(),
                engine: self.identity.clone(),
                capabilities: vec![],
            },
        };
        let id = self.next_id;
        self.next_id += 1;
        let hello = exchange(
            &mut running.process,
            id,
            &Request::Hello {
                protocol: PROTOCOL_VERSION.into(),
            },
            deadline,
            timeout,
        )
        .and_then(|v| {
            serde_json::from_value::<Hello>(v)
                .map_err(|e| EngineError::Garbage(format!("hello: {e}")))
        });
        let hello = match hello {
            Ok(h) => h,
            Err(e) => {
                running.process.kill();
                return Err(explain(e, &mut running.process));
            }
        };
        if hello.protocol != PROTOCOL_VERSION {
            return Err(EngineError::Failed(format!(
                "engine speaks protocol `{}`, the harness `{PROTOCOL_VERSION}`",
                hello.protocol
            )));
        }
        running.hello = hello;
        Ok(running)
    }

    fn ensure_running(&mut self, deadline: Instant, timeout: Duration) -> Result<(), EngineError> {
        if self.running.is_none() {
            let r = self.spawn(deadline, timeout)?;
            self.identity = EngineIdentity {
                driver: format!("adapter: {}", self.command),
                ..r.hello.engine.clone()
            };
            (self.capabilities, self.unknown_capabilities) =
                declared_capabilities(r.hello.capabilities.iter().map(String::as_str));
            self.running = Some(r);
        }
        Ok(())
    }

    /// One request under the case's `timeout`, which covers restarting the engine (and its
    /// hello) when the previous one was discarded.
    fn call(&mut self, req: Request, timeout: Duration) -> EngineResult<serde_json::Value> {
        let deadline = Instant::now() + timeout;
        self.ensure_running(deadline, timeout)?;
        let id = self.next_id;
        self.next_id += 1;
        let r = self.running.as_mut().expect("running");
        match exchange(&mut r.process, id, &req, deadline, timeout) {
            Ok(v) => Ok(v),
            Err(
                e @ (EngineError::Refused(_)
                | EngineError::Unsupported(..)
                | EngineError::Failed(_)),
            ) => Err(e),
            Err(e) => {
                // Crash, hang or garbage: the process is in an unknown state; end its whole
                // group, and start afresh for the next request.
                let mut r = self.running.take().expect("running");
                r.process.kill();
                Err(explain(e, &mut r.process))
            }
        }
    }
}

/// Add what the ended process left: its exit status to a crash, its stderr tail to a crash
/// or garbage.
fn explain(e: EngineError, p: &mut EngineProcess) -> EngineError {
    let tail = p.stderr_tail();
    match e {
        EngineError::Crashed(m) => {
            let status = p
                .try_status()
                .map(|s| format!(" (it {})", describe_status(s)));
            EngineError::Crashed(m + &status.unwrap_or_default() + &tail)
        }
        EngineError::Garbage(m) => EngineError::Garbage(m + &tail),
        other => other,
    }
}

impl Drop for AdapterEngine {
    fn drop(&mut self) {
        if let Some(mut r) = self.running.take() {
            // Like every request, `shutdown` carries the next id (PROTOCOL.md).
            let line = serde_json::to_string(&Envelope {
                id: self.next_id,
                request: Request::Shutdown,
            })
            .unwrap_or_default();
            r.process.send(format!("{line}\n").into_bytes());
            r.process.close_stdin();
            // A moment to exit by itself; then its group ends whatever it is doing.
            r.process
                .wait_until(Instant::now() + Duration::from_millis(500));
            r.process.kill();
        }
    }
}

/// Send one request and wait, until `deadline`, for the reply with the same id (`timeout`
/// names the deadline in a report). Everything the engine writes meanwhile counts against
/// [`MAX_REPLY_BYTES`].
fn exchange(
    p: &mut EngineProcess,
    id: u64,
    req: &Request,
    deadline: Instant,
    timeout: Duration,
) -> EngineResult<serde_json::Value> {
    let mut line = serde_json::to_vec(&Envelope {
        id,
        request: req.clone(),
    })
    .map_err(|e| EngineError::Failed(e.to_string()))?;
    line.push(b'\n');
    let line_len = line.len();
    p.send(line);
    let line = match p.read_line(deadline, MAX_REPLY_BYTES) {
        Ok(l) => l,
        Err(ReadError::Timeout) => {
            let unread = p.unread_input();
            let why = (unread > 0).then(|| {
                format!(
                    "it stopped reading its stdin with {unread} of the request's {} bytes \
                     not taken",
                    line_len
                )
            });
            return Err(EngineError::Timeout(timeout, why));
        }
        Err(ReadError::Closed) => {
            return Err(EngineError::Crashed(
                "the engine ended (or closed its stdout) before answering".into(),
            ))
        }
        Err(ReadError::Io(e)) => {
            return Err(EngineError::Crashed(format!("reading its stdout: {e}")))
        }
        Err(ReadError::OverBudget) => {
            return Err(EngineError::Garbage(format!(
                "more than {} MiB on stdout without a complete reply line",
                MAX_REPLY_BYTES >> 20
            )))
        }
    };
    let reply: Reply = serde_json::from_slice(&line).map_err(|e| {
        let shown: String = String::from_utf8_lossy(&line).chars().take(200).collect();
        let utf8 = utf8_problem(&line)
            .map(|m| format!("; {m}"))
            .unwrap_or_default();
        EngineError::Garbage(format!("not a protocol reply ({e}{utf8}): {shown:?}"))
    })?;
    if reply.id != id {
        return Err(EngineError::Garbage(format!(
            "reply for id {} while waiting for id {id}",
            reply.id
        )));
    }
    if reply.ok {
        return Ok(reply.result.unwrap_or(serde_json::Value::Null));
    }
    let err = reply.error.unwrap_or(ReplyError {
        kind: "failed".into(),
        message: "no error object".into(),
        capability: None,
    });
    Err(match err.kind.as_str() {
        "refused" => EngineError::Refused(err.message),
        "unsupported" => match err.unsupported() {
            Some((c, why)) => EngineError::Unsupported(c, why),
            None => EngineError::Failed(format!(
                "`unsupported` names no known capability (field `capability` {:?}, message {:?})",
                err.capability, err.message
            )),
        },
        _ => EngineError::Failed(err.message),
    })
}

fn field<T: serde::de::DeserializeOwned>(v: serde_json::Value, name: &str) -> EngineResult<T> {
    serde_json::from_value(v.get(name).cloned().unwrap_or(serde_json::Value::Null))
        .map_err(|e| EngineError::Garbage(format!("result field `{name}`: {e}")))
}

/// An `ok` answer to a request that writes a trace must have written it (a regular file).
fn trace_written(op: &str, out: &std::path::Path) -> EngineResult<()> {
    if !out.exists() {
        return Err(EngineError::Garbage(format!(
            "{op} answered ok but wrote no trace at {}",
            out.display()
        )));
    }
    crate::trace::regular_file_len(out)
        .map_err(|e| EngineError::Garbage(format!("{op} trace: {e:#}")))?;
    Ok(())
}

impl Engine for AdapterEngine {
    fn identity(&self) -> EngineIdentity {
        self.identity.clone()
    }
    fn capabilities(&self) -> BTreeSet<Capability> {
        self.capabilities.clone()
    }
    fn load(&mut self, req: &LoadRequest, timeout: Duration) -> EngineResult<()> {
        self.need(Capability::Load)?;
        self.call(Request::Load(req.clone()), timeout).map(|_| ())
    }
    fn tokenize(
        &mut self,
        req: &TokenizeRequest,
        timeout: Duration,
    ) -> EngineResult<Vec<Vec<u32>>> {
        self.need(Capability::Tokenize)?;
        field(self.call(Request::Tokenize(req.clone()), timeout)?, "ids")
    }
    fn render(&mut self, req: &RenderRequest, timeout: Duration) -> EngineResult<String> {
        self.need(Capability::Render)?;
        field(self.call(Request::Render(req.clone()), timeout)?, "prompt")
    }
    fn parse(&mut self, req: &ParseRequest, timeout: Duration) -> EngineResult<serde_json::Value> {
        self.need(Capability::Parse)?;
        field(self.call(Request::Parse(req.clone()), timeout)?, "message")
    }
    fn forward(&mut self, req: &ForwardRequest, timeout: Duration) -> EngineResult<()> {
        self.need(Capability::Forward)?;
        self.call(Request::Forward(req.clone()), timeout)?;
        trace_written("forward", &req.out)
    }
    fn dspark(&mut self, req: &DsparkRequest, timeout: Duration) -> EngineResult<()> {
        self.need(Capability::Dspark)?;
        self.call(Request::Dspark(req.clone()), timeout)?;
        trace_written("dspark", &req.out)
    }
    fn vision_preprocess(
        &mut self,
        req: &VisionPreprocessRequest,
        timeout: Duration,
    ) -> EngineResult<()> {
        self.need(Capability::VisionPreprocess)?;
        self.call(Request::VisionPreprocess(req.clone()), timeout)?;
        trace_written("vision_preprocess", &req.out)
    }
    fn vision_tower(&mut self, req: &VisionTowerRequest, timeout: Duration) -> EngineResult<()> {
        self.need(Capability::VisionTower)?;
        self.call(Request::VisionTower(req.clone()), timeout)?;
        trace_written("vision_tower", &req.out)
    }
    fn vision_span(
        &mut self,
        req: &VisionSpanRequest,
        timeout: Duration,
    ) -> EngineResult<VisionSpan> {
        self.need(Capability::VisionSpan)?;
        let v = self.call(Request::VisionSpan(req.clone()), timeout)?;
        serde_json::from_value(v).map_err(|e| EngineError::Garbage(format!("vision_span: {e}")))
    }
    fn engram_hash(
        &mut self,
        req: &EngramHashRequest,
        timeout: Duration,
    ) -> EngineResult<EngramHashes> {
        self.need(Capability::EngramHash)?;
        field(self.call(Request::EngramHash(req.clone()), timeout)?, "ids")
    }
}

// ------------------------------------------------------------------------- engine side

/// Serve `engine` over the protocol on `input`/`output` until `shutdown` or end of input.
/// Malformed requests (not UTF-8, not JSON, not a request) get an error reply (id 0 when
/// none could be read) and the loop goes on.
pub fn serve(
    engine: &mut dyn Engine,
    input: impl BufRead,
    output: impl Write,
) -> anyhow::Result<()> {
    serve_lines_up_to(engine, input, output, MAX_REQUEST_BYTES)
}

/// Bytes one request line may take: as much as a reply may (the harness's side of the same
/// bound), far above what any request needs.
pub const MAX_REQUEST_BYTES: usize = crate::engine_process::MAX_REPLY_BYTES;

/// [`serve`] with requests of at most `max_line` bytes: a longer line is answered with an
/// error (id 0: its id is not read) and skipped without being held in memory.
fn serve_lines_up_to(
    engine: &mut dyn Engine,
    mut input: impl BufRead,
    mut output: impl Write,
    max_line: usize,
) -> anyhow::Result<()> {
    let no_timeout = Duration::from_secs(24 * 3600);
    let mut raw = Vec::new();
    loop {
        raw.clear();
        match read_line_up_to(&mut input, &mut raw, max_line)? {
            LineRead::End => break,
            LineRead::Line => {}
            LineRead::TooLong(total) => {
                write_reply(
                    &mut output,
                    0,
                    Err(ReplyError {
                        kind: "failed".into(),
                        message: format!(
                            "malformed request: the line has {total} bytes, more than the \
                             {max_line} a request may take; skipped"
                        ),
                        capability: None,
                    }),
                )?;
                continue;
            }
        }
        let line = match std::str::from_utf8(&raw) {
            Ok(l) => l,
            Err(_) => {
                let problem = utf8_problem(&raw).unwrap_or_default();
                write_reply(
                    &mut output,
                    0,
                    Err(ReplyError {
                        kind: "failed".into(),
                        message: format!("malformed request: the line is {problem}"),
                        capability: None,
                    }),
                )?;
                continue;
            }
        };
        if line.trim().is_empty() {
            continue;
        }
        let env: Envelope = match serde_json::from_str(line) {
            Ok(e) => e,
            Err(e) => {
                let id = serde_json::from_str::<serde_json::Value>(line)
                    .ok()
                    .and_then(|v| v["id"].as_u64())
                    .unwrap_or(0);
                write_reply(
                    &mut output,
                    id,
                    Err(ReplyError {
                        kind: "failed".into(),
                        message: format!("malformed request: {e}"),
                        capability: None,
                    }),
                )?;
                continue;
            }
        };
        let id = env.id;
        let result: Result<serde_json::Value, EngineError> = match env.request {
            Request::Shutdown => {
                write_reply(&mut output, id, Ok(serde_json::json!({})))?;
                return Ok(());
            }
            Request::Hello { protocol } => {
                if protocol != PROTOCOL_VERSION {
                    Err(EngineError::Failed(format!(
                        "this engine speaks `{PROTOCOL_VERSION}`, not `{protocol}`"
                    )))
                } else {
                    let hello = Hello {
                        protocol: PROTOCOL_VERSION.into(),
                        engine: engine.identity(),
                        capabilities: engine
                            .capabilities()
                            .iter()
                            .map(|c| c.as_str().to_string())
                            .collect(),
                    };
                    Ok(serde_json::to_value(hello)?)
                }
            }
            Request::Load(r) => engine.load(&r, no_timeout).map(|_| serde_json::json!({})),
            Request::Tokenize(r) => engine
                .tokenize(&r, no_timeout)
                .map(|ids| serde_json::json!({ "ids": ids })),
            Request::Render(r) => engine
                .render(&r, no_timeout)
                .map(|p| serde_json::json!({ "prompt": p })),
            Request::Parse(r) => engine
                .parse(&r, no_timeout)
                .map(|m| serde_json::json!({ "message": m })),
            Request::Forward(r) => engine
                .forward(&r, no_timeout)
                .map(|_| serde_json::json!({ "trace": r.out })),
            Request::EngramHash(r) => engine
                .engram_hash(&r, no_timeout)
                .map(|ids| serde_json::json!({ "ids": ids })),
            Request::Dspark(r) => engine
                .dspark(&r, no_timeout)
                .map(|_| serde_json::json!({ "trace": r.out })),
            Request::VisionPreprocess(r) => engine
                .vision_preprocess(&r, no_timeout)
                .map(|_| serde_json::json!({ "patches": r.out })),
            Request::VisionTower(r) => engine
                .vision_tower(&r, no_timeout)
                .map(|_| serde_json::json!({ "trace": r.out })),
            Request::VisionSpan(r) => engine.vision_span(&r, no_timeout).and_then(|s| {
                serde_json::to_value(s).map_err(|e| EngineError::Failed(e.to_string()))
            }),
        };
        let r = result.map_err(|e| match e {
            EngineError::Refused(m) => ReplyError {
                kind: "refused".into(),
                message: m,
                capability: None,
            },
            EngineError::Unsupported(c, why) => ReplyError {
                kind: "unsupported".into(),
                message: why.unwrap_or_else(|| format!("the engine lacks `{c}`")),
                capability: Some(c.as_str().into()),
            },
            other => ReplyError {
                kind: "failed".into(),
                message: other.to_string(),
                capability: None,
            },
        });
        write_reply(&mut output, id, r)?;
    }
    Ok(())
}

enum LineRead {
    End,
    /// `buf` holds the line (with its `\n`, if the input did not end first).
    Line,
    /// The line had this many bytes (newline excluded) and was consumed, not kept.
    TooLong(u64),
}

/// Read one line into `buf`, keeping at most `max` bytes; a longer line is read to its end
/// and dropped.
fn read_line_up_to(
    input: &mut impl BufRead,
    buf: &mut Vec<u8>,
    max: usize,
) -> std::io::Result<LineRead> {
    let mut total: u64 = 0;
    loop {
        let available = input.fill_buf()?;
        if available.is_empty() {
            return Ok(if total == 0 {
                LineRead::End
            } else if buf.len() as u64 == total {
                LineRead::Line
            } else {
                LineRead::TooLong(total)
            });
        }
        let (take, found) = match available.iter().position(|&b| b == b'\n') {
            Some(i) => (i + 1, true),
            None => (available.len(), false),
        };
        let content = if found { take - 1 } else { take };
        total += content as u64;
        if total <= max as u64 {
            buf.extend_from_slice(&available[..take]);
        } else {
            buf.clear();
        }
        input.consume(take);
        if found {
            return Ok(if total <= max as u64 {
                LineRead::Line
            } else {
                LineRead::TooLong(total)
            });
        }
    }
}

fn write_reply(
    out: &mut impl Write,
    id: u64,
    r: Result<serde_json::Value, ReplyError>,
) -> anyhow::Result<()> {
    let reply = match r {
        Ok(v) => Reply {
            id,
            ok: true,
            result: Some(v),
            error: None,
        },
        Err(e) => Reply {
            id,
            ok: false,
            result: None,
            error: Some(e),
        },
    };
    writeln!(out, "{}", serde_json::to_string(&reply)?)?;
    out.flush()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reply lines a serve loop wrote.
    fn replies(out: &[u8]) -> Vec<Reply> {
        out.split(|&b| b == b'\n')
            .filter(|l| !l.is_empty())
            .map(|l| serde_json::from_slice(l).unwrap())
            .collect()
    }

    /// A request line that is not UTF-8 gets an error reply, and the requests after it are
    /// still answered (as for malformed JSON).
    #[test]
    fn serve_answers_a_non_utf8_line_and_goes_on() {
        let mut engine = crate::reference::ReferenceEngine::new();
        let mut input = b"\xff\xfe{\"id\": 1}\n".to_vec();
        input.extend_from_slice(
            b"{\"id\": 2, \"op\": \"hello\", \"protocol\": \"ds41-engine/1\"}\n",
        );
        let mut out = Vec::new();
        serve(&mut engine, &input[..], &mut out).unwrap();
        let replies = replies(&out);
        assert_eq!(replies.len(), 2, "{}", String::from_utf8_lossy(&out));
        let err = replies[0].error.as_ref().unwrap();
        assert!(
            !replies[0].ok && err.message.contains("not UTF-8"),
            "{err:?}"
        );
        assert!(replies[1].ok && replies[1].id == 2);
    }

    /// A request line over the bound is answered with an error naming its length and is
    /// not kept; the requests after it are still answered.
    #[test]
    fn serve_refuses_an_overlong_line_and_goes_on() {
        let mut engine = crate::reference::ReferenceEngine::new();
        let hello = b"{\"id\": 2, \"op\": \"hello\", \"protocol\": \"ds41-engine/1\"}\n";
        let mut input = vec![b'x'; 10_000];
        input.push(b'\n');
        input.extend_from_slice(hello);
        // Small reads, so the long line arrives in many pieces.
        let reader = std::io::BufReader::with_capacity(7, &input[..]);
        let mut out = Vec::new();
        serve_lines_up_to(&mut engine, reader, &mut out, 100).unwrap();
        let replies = replies(&out);
        assert_eq!(replies.len(), 2, "{}", String::from_utf8_lossy(&out));
        let err = replies[0].error.as_ref().unwrap();
        assert!(err.message.contains("10000 bytes"), "{err:?}");
        assert!(replies[1].ok && replies[1].id == 2);
        // A request exactly at the bound is served.
        let mut out = Vec::new();
        serve_lines_up_to(&mut engine, &hello[..], &mut out, hello.len() - 1).unwrap();
        assert!(
            String::from_utf8_lossy(&out).contains("\"ok\":true"),
            "{}",
            String::from_utf8_lossy(&out)
        );
    }
}
