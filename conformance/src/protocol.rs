//! The JSON-lines stdio engine protocol (PROTOCOL.md): the harness side (`AdapterEngine`,
//! which drives any program speaking it) and the engine side (`serve`, which puts any
//! `Engine` — the built-in reference in `ds41 serve-adapter` — behind it).
//!
//! One JSON object per line each way. The harness sends `{"id": N, "op": ..., ...}`; the
//! engine answers `{"id": N, "ok": true, "result": {...}}` or
//! `{"id": N, "ok": false, "error": {"kind": "refused"|"unsupported"|"failed", "message": ...}}`.
//! The first request is `hello`; the answer declares the engine and its capabilities.

use std::collections::{BTreeSet, VecDeque};
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::engine_api::*;

pub const PROTOCOL_VERSION: &str = "ds41-engine/1";
const HELLO_TIMEOUT: Duration = Duration::from_secs(60);
const STDERR_TAIL_LINES: usize = 40;

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
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Hello {
    pub protocol: String,
    pub engine: EngineIdentity,
    pub capabilities: Vec<String>,
}

// ------------------------------------------------------------------------- harness side

struct Running {
    child: Child,
    stdin: ChildStdin,
    lines: Receiver<Option<String>>,
    hello: Hello,
}

/// An engine behind the protocol, run as `sh -c COMMAND`. Restarted after a crash, a
/// timeout or garbage, so one bad case never takes the rest of the run with it.
pub struct AdapterEngine {
    command: String,
    running: Option<Running>,
    next_id: u64,
    stderr: Arc<Mutex<VecDeque<String>>>,
    identity: EngineIdentity,
    capabilities: BTreeSet<Capability>,
    /// Capabilities the engine named that this harness does not know (reported, ignored).
    pub unknown_capabilities: Vec<String>,
}

impl AdapterEngine {
    /// Start the engine and perform the hello; an engine that cannot even say hello is a
    /// configuration error.
    pub fn start(command: &str) -> anyhow::Result<AdapterEngine> {
        let mut e = AdapterEngine {
            command: command.to_string(),
            running: None,
            next_id: 1,
            stderr: Arc::new(Mutex::new(VecDeque::new())),
            identity: EngineIdentity {
                name: String::new(),
                version: String::new(),
                commit: None,
                driver: String::new(),
            },
            capabilities: BTreeSet::new(),
            unknown_capabilities: Vec::new(),
        };
        e.ensure_running()
            .map_err(|err| anyhow::anyhow!("engine `{command}`: {err}"))?;
        Ok(e)
    }

    fn stderr_tail(&self) -> String {
        let lines = self
            .stderr
            .lock()
            .map(|q| q.iter().cloned().collect::<Vec<_>>())
            .unwrap_or_default();
        if lines.is_empty() {
            String::new()
        } else {
            format!(
                "\n--- engine stderr (last {} lines) ---\n{}",
                lines.len(),
                lines.join("\n")
            )
        }
    }

    fn spawn(&mut self) -> Result<Running, EngineError> {
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(&self.command)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| EngineError::Crashed(format!("cannot start `{}`: {e}", self.command)))?;
        let stdout = child.stdout.take().expect("piped");
        let stderr = child.stderr.take().expect("piped");
        let stdin = child.stdin.take().expect("piped");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut r = BufReader::new(stdout);
            loop {
                let mut line = String::new();
                match r.read_line(&mut line) {
                    Ok(0) | Err(_) => {
                        let _ = tx.send(None);
                        break;
                    }
                    Ok(_) => {
                        if tx.send(Some(line)).is_err() {
                            break;
                        }
                    }
                }
            }
        });
        let tail = Arc::clone(&self.stderr);
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Ok(mut q) = tail.lock() {
                    if q.len() == STDERR_TAIL_LINES {
                        q.pop_front();
                    }
                    q.push_back(line);
                }
            }
        });
        let mut running = Running {
            child,
            stdin,
            lines: rx,
            hello: Hello {
                protocol: String::new(),
                engine: self.identity.clone(),
                capabilities: vec![],
            },
        };
        let id = self.next_id;
        self.next_id += 1;
        let v = exchange(
            &mut running,
            id,
            &Request::Hello {
                protocol: PROTOCOL_VERSION.into(),
            },
            HELLO_TIMEOUT,
        )?;
        let hello: Hello =
            serde_json::from_value(v).map_err(|e| EngineError::Garbage(format!("hello: {e}")))?;
        if hello.protocol != PROTOCOL_VERSION {
            return Err(EngineError::Failed(format!(
                "engine speaks protocol `{}`, the harness `{PROTOCOL_VERSION}`",
                hello.protocol
            )));
        }
        running.hello = hello;
        Ok(running)
    }

    fn ensure_running(&mut self) -> Result<(), EngineError> {
        if self.running.is_none() {
            let r = self.spawn().map_err(|e| self.with_stderr(e))?;
            self.identity = EngineIdentity {
                driver: format!("adapter: {}", self.command),
                ..r.hello.engine.clone()
            };
            self.capabilities.clear();
            self.unknown_capabilities.clear();
            for c in &r.hello.capabilities {
                match Capability::parse(c) {
                    Some(c) => {
                        self.capabilities.insert(c);
                    }
                    None => self.unknown_capabilities.push(c.clone()),
                }
            }
            self.running = Some(r);
        }
        Ok(())
    }

    fn with_stderr(&self, e: EngineError) -> EngineError {
        let tail = self.stderr_tail();
        match e {
            EngineError::Crashed(m) => EngineError::Crashed(m + &tail),
            EngineError::Garbage(m) => EngineError::Garbage(m + &tail),
            EngineError::Timeout(d) => EngineError::Timeout(d),
            other => other,
        }
    }

    /// Kill the engine process (ours, by its own handle) so the next call starts afresh.
    fn discard(&mut self) {
        if let Some(mut r) = self.running.take() {
            let _ = r.child.kill();
            let _ = r.child.wait();
        }
    }

    fn call(&mut self, req: Request, timeout: Duration) -> EngineResult<serde_json::Value> {
        self.ensure_running()?;
        let id = self.next_id;
        self.next_id += 1;
        let r = self.running.as_mut().expect("running");
        match exchange(r, id, &req, timeout) {
            Ok(v) => Ok(v),
            Err(
                e
                @ (EngineError::Refused(_) | EngineError::Unsupported(_) | EngineError::Failed(_)),
            ) => Err(e),
            Err(e) => {
                // Crash, hang or garbage: the process is in an unknown state; replace it.
                let e = if let EngineError::Crashed(m) = e {
                    let status = self.running.as_mut().and_then(|r| r.child.wait().ok());
                    EngineError::Crashed(format!(
                        "{m}{}",
                        status.map(|s| format!(" ({s})")).unwrap_or_default()
                    ))
                } else {
                    e
                };
                self.discard();
                std::thread::sleep(Duration::from_millis(20));
                Err(self.with_stderr(e))
            }
        }
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
            let _ = writeln!(r.stdin, "{line}");
            drop(r.stdin);
            // Give it a moment to exit by itself, then make sure it is gone.
            for _ in 0..50 {
                if matches!(r.child.try_wait(), Ok(Some(_))) {
                    return;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            let _ = r.child.kill();
            let _ = r.child.wait();
        }
    }
}

/// Send one request and wait for the reply with the same id.
fn exchange(
    r: &mut Running,
    id: u64,
    req: &Request,
    timeout: Duration,
) -> EngineResult<serde_json::Value> {
    let line = serde_json::to_string(&Envelope {
        id,
        request: req.clone(),
    })
    .map_err(|e| EngineError::Failed(e.to_string()))?;
    if writeln!(r.stdin, "{line}")
        .and_then(|_| r.stdin.flush())
        .is_err()
    {
        return Err(EngineError::Crashed("the engine closed its stdin".into()));
    }
    let deadline = std::time::Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let line = match r.lines.recv_timeout(left) {
            Ok(Some(l)) => l,
            Ok(None) | Err(RecvTimeoutError::Disconnected) => {
                return Err(EngineError::Crashed(
                    "the engine exited (stdout closed) before answering".into(),
                ))
            }
            Err(RecvTimeoutError::Timeout) => return Err(EngineError::Timeout(timeout)),
        };
        if line.trim().is_empty() {
            continue;
        }
        let reply: Reply = serde_json::from_str(line.trim()).map_err(|e| {
            let shown: String = line.trim().chars().take(200).collect();
            EngineError::Garbage(format!("not a protocol reply ({e}): {shown:?}"))
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
        });
        return Err(match err.kind.as_str() {
            "refused" => EngineError::Refused(err.message),
            "unsupported" => match Capability::parse(&err.message) {
                Some(c) => EngineError::Unsupported(c),
                None => EngineError::Failed(format!("unsupported: {}", err.message)),
            },
            _ => EngineError::Failed(err.message),
        });
    }
}

fn field<T: serde::de::DeserializeOwned>(v: serde_json::Value, name: &str) -> EngineResult<T> {
    serde_json::from_value(v.get(name).cloned().unwrap_or(serde_json::Value::Null))
        .map_err(|e| EngineError::Garbage(format!("result field `{name}`: {e}")))
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
        if !req.out.exists() {
            return Err(EngineError::Garbage(format!(
                "forward answered ok but wrote no trace at {}",
                req.out.display()
            )));
        }
        Ok(())
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
/// Malformed requests get an error reply (id 0 when none could be read) and the loop goes on.
pub fn serve(
    engine: &mut dyn Engine,
    input: impl BufRead,
    mut output: impl Write,
) -> anyhow::Result<()> {
    let no_timeout = Duration::from_secs(24 * 3600);
    for line in input.lines() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        let env: Envelope = match serde_json::from_str(&line) {
            Ok(e) => e,
            Err(e) => {
                let id = serde_json::from_str::<serde_json::Value>(&line)
                    .ok()
                    .and_then(|v| v["id"].as_u64())
                    .unwrap_or(0);
                write_reply(
                    &mut output,
                    id,
                    Err(("failed", format!("malformed request: {e}"))),
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
        };
        let r = result.map_err(|e| match e {
            EngineError::Refused(m) => ("refused", m),
            EngineError::Unsupported(c) => ("unsupported", c.as_str().to_string()),
            other => ("failed", other.to_string()),
        });
        write_reply(&mut output, id, r)?;
    }
    Ok(())
}

fn write_reply(
    out: &mut impl Write,
    id: u64,
    r: Result<serde_json::Value, (&str, String)>,
) -> anyhow::Result<()> {
    let reply = match r {
        Ok(v) => Reply {
            id,
            ok: true,
            result: Some(v),
            error: None,
        },
        Err((kind, message)) => Reply {
            id,
            ok: false,
            result: None,
            error: Some(ReplyError {
                kind: kind.into(),
                message,
            }),
        },
    };
    writeln!(out, "{}", serde_json::to_string(&reply)?)?;
    out.flush()?;
    Ok(())
}
