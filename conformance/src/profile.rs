//! YAML command profiles (CONTRACT.md §2c, PROFILES.md): certify an existing CLI without writing an
//! adapter. A profile names the engine, declares its capabilities, and gives per operation a
//! command template (argv, no shell), extra environment, and where and in which layout the
//! outputs land; the driver turns those files into a trace. Placeholders are checked when
//! the profile is loaded, so a typo is a configuration error, not a failed case.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail};
use serde::Deserialize;

use crate::engine_api::*;
use crate::engine_process::{describe_status, utf8_problem, EngineProcess, RunError};
use crate::trace::{read_raw_f32, read_raw_f32_rows, regular_file_len, TraceFile, TraceTensor};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Profile {
    pub engine: EngineIdentity,
    pub capabilities: Vec<String>,
    /// Exit codes by which the engine refuses its input (a broken checkpoint, a state from
    /// another model): a typed refusal. Any other non-zero exit is a crash (PROFILES.md).
    #[serde(default)]
    pub refusal_exit_codes: Vec<i32>,
    /// Named values usable as `{var.NAME}`; `{env.NAME}` reads the harness environment.
    #[serde(default)]
    pub vars: BTreeMap<String, String>,
    /// Environment for every command.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    #[serde(default)]
    pub load: Option<Op>,
    #[serde(default)]
    pub forward: Option<ForwardOp>,
    #[serde(default)]
    pub tokenize: Option<TokenizeOp>,
    #[serde(default)]
    pub render: Option<Op>,
    #[serde(default)]
    pub parse: Option<Op>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Op {
    pub command: Vec<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ForwardOp {
    pub command: Vec<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    pub outputs: BTreeMap<String, Output>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Output {
    pub file: String,
    pub layout: Layout,
}

/// How an output file is laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Layout {
    /// Raw little-endian f32 logits of the last token: `vocab` floats.
    LastTokenF32,
    /// Raw little-endian f32 logits, one row per step: `steps x vocab`.
    StepsF32,
    /// Raw f32 per-layer stream of the last token only: `layers x hc x dim`.
    LastTokenLayersF32,
    /// Raw f32 per-layer streams of every token, token-major: `tokens x layers x hc x dim`.
    TokensLayersF32,
    /// WASTE_DUMP_ROUTE text: `pos layer id*K w*K lookahead*K` per line.
    WasteRoute,
    /// A complete trace-format safetensors file.
    Trace,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IdsOutput {
    /// `n id id ...` on one line per text (WASTE `test_tokenizer`).
    CountThenIds,
    /// A JSON array of ids per line.
    JsonIds,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenizeOp {
    /// Run once per text (`{text}`); the first line of stdout holds its ids.
    pub command: Vec<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    pub stdout: IdsOutput,
}

const COMMON: [&str; 2] = ["out_dir", "model"];
const FORWARD: [&str; 9] = [
    "ids_csv",
    "ids_space",
    "n_tokens",
    "prefill",
    "numerics",
    "index_k",
    "out",
    "save_state",
    "load_state",
];

fn placeholders(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = s;
    while let Some(i) = rest.find('{') {
        let Some(j) = rest[i..].find('}') else { break };
        out.push(rest[i + 1..i + j].to_string());
        rest = &rest[i + j + 1..];
    }
    out
}

impl Profile {
    pub fn load(path: &Path) -> anyhow::Result<Profile> {
        let text = std::fs::read_to_string(path).map_err(|e| anyhow!("{}: {e}", path.display()))?;
        let de = serde_yaml::Deserializer::from_str(&text);
        let p: Profile = serde_path_to_error::deserialize(de)
            .map_err(|e| anyhow!("{}: field `{}`: {}", path.display(), e.path(), e.inner()))?;
        p.validate()
            .map_err(|e| anyhow!("{}: {e}", path.display()))?;
        Ok(p)
    }

    fn validate(&self) -> Result<(), String> {
        let caps: BTreeSet<Capability> = self
            .capabilities
            .iter()
            .map(|c| {
                Capability::parse(c)
                    .ok_or(format!("field `capabilities`: unknown capability `{c}`"))
            })
            .collect::<Result<_, _>>()?;
        let need = |c: Capability, present: bool, section: &str| {
            if caps.contains(&c) && !present {
                Err(format!(
                    "field `capabilities`: `{c}` is declared but there is no `{section}` section"
                ))
            } else {
                Ok(())
            }
        };
        need(Capability::Load, self.load.is_some(), "load")?;
        need(Capability::Forward, self.forward.is_some(), "forward")?;
        need(Capability::Tokenize, self.tokenize.is_some(), "tokenize")?;
        need(Capability::Render, self.render.is_some(), "render")?;
        need(Capability::Parse, self.parse.is_some(), "parse")?;
        // Command profiles have no Engram hashing section: their engram cases are NotSupported.
        need(Capability::EngramHash, false, "engram_hash")?;
        // Nor a replay input: a replay request would be run as a plain forward.
        need(Capability::Replay, false, "replay")?;
        let check =
            |section: &str, templates: Vec<&String>, extra: &[&str]| -> Result<(), String> {
                for t in templates {
                    for p in placeholders(t) {
                        let ok = COMMON.contains(&p.as_str())
                            || extra.contains(&p.as_str())
                            || p.strip_prefix("var.")
                                .is_some_and(|v| self.vars.contains_key(v))
                            || p.starts_with("env.");
                        if !ok {
                            return Err(format!(
                                "section `{section}`: unknown placeholder `{{{p}}}` in `{t}`"
                            ));
                        }
                    }
                }
                Ok(())
            };
        let global: Vec<&String> = self.env.values().collect();
        check("env", global, &[])?;
        if let Some(op) = &self.load {
            check(
                "load",
                op.command.iter().chain(op.env.values()).collect(),
                &[],
            )?;
        }
        if let Some(op) = &self.render {
            check(
                "render",
                op.command.iter().chain(op.env.values()).collect(),
                &["conversation", "thinking_mode"],
            )?;
        }
        if let Some(op) = &self.parse {
            check(
                "parse",
                op.command.iter().chain(op.env.values()).collect(),
                &["completion", "thinking", "tolerant"],
            )?;
        }
        if let Some(op) = &self.tokenize {
            check(
                "tokenize",
                op.command.iter().chain(op.env.values()).collect(),
                &["text", "tokenizer", "markup"],
            )?;
        }
        if let Some(op) = &self.forward {
            let files: Vec<&String> = op.outputs.values().map(|o| &o.file).collect();
            check(
                "forward",
                op.command
                    .iter()
                    .chain(op.env.values())
                    .chain(files)
                    .collect(),
                &FORWARD,
            )?;
            for (name, o) in &op.outputs {
                let ok = matches!(
                    (name.as_str(), o.layout),
                    ("logits", Layout::LastTokenF32 | Layout::StepsF32)
                        | (
                            "residual",
                            Layout::LastTokenLayersF32 | Layout::TokensLayersF32
                        )
                        | ("experts", Layout::WasteRoute)
                        | ("trace", Layout::Trace)
                );
                if !ok {
                    return Err(format!(
                        "section `forward.outputs.{name}`: layout {:?} does not produce `{name}`",
                        o.layout
                    ));
                }
            }
            if caps.contains(&Capability::State) {
                let all = op.command.join(" ");
                if !all.contains("{save_state}") || !all.contains("{load_state}") {
                    return Err("field `capabilities`: `state` needs {save_state} and {load_state} in forward.command".into());
                }
            }
        }
        if self.command_count() == 0 {
            return Err("the profile defines no operation".into());
        }
        if let Some(c) = self
            .refusal_exit_codes
            .iter()
            .find(|&&c| !(1..=255).contains(&c))
        {
            return Err(format!(
                "field `refusal_exit_codes`: {c} is not an exit code a refusal can have (1..=255)"
            ));
        }
        Ok(())
    }

    /// Every template of the profile (commands, environment values, output files).
    fn templates(&self) -> Vec<&String> {
        let mut all: Vec<&String> = self.env.values().collect();
        for o in [&self.load, &self.render, &self.parse]
            .into_iter()
            .flatten()
        {
            all.extend(o.command.iter().chain(o.env.values()));
        }
        if let Some(t) = &self.tokenize {
            all.extend(t.command.iter().chain(t.env.values()));
        }
        if let Some(f) = &self.forward {
            all.extend(f.command.iter().chain(f.env.values()));
            all.extend(f.outputs.values().map(|o| &o.file));
        }
        all
    }

    /// The `{env.NAME}` placeholders whose variable is not set in this environment: a run
    /// with such a profile could only fail every case, so it is a configuration error.
    fn unset_environment(&self) -> Vec<String> {
        let mut unset: Vec<String> = self
            .templates()
            .into_iter()
            .flat_map(|t| placeholders(t))
            .filter_map(|p| p.strip_prefix("env.").map(str::to_string))
            .filter(|v| std::env::var_os(v).is_none())
            .collect();
        unset.sort();
        unset.dedup();
        unset
    }

    fn command_count(&self) -> usize {
        [
            self.load.is_some(),
            self.forward.is_some(),
            self.tokenize.is_some(),
            self.render.is_some(),
            self.parse.is_some(),
        ]
        .iter()
        .filter(|&&x| x)
        .count()
    }
}

/// Fill `{name}` placeholders.
fn fill(
    t: &str,
    vals: &BTreeMap<&str, String>,
    vars: &BTreeMap<String, String>,
) -> Result<String, EngineError> {
    let mut out = String::new();
    let mut rest = t;
    while let Some(i) = rest.find('{') {
        out += &rest[..i];
        let Some(j) = rest[i..].find('}') else {
            out += &rest[i..];
            rest = "";
            break;
        };
        let key = &rest[i + 1..i + j];
        let v = if let Some(v) = key.strip_prefix("var.") {
            vars.get(v).cloned()
        } else if let Some(v) = key.strip_prefix("env.") {
            Some(std::env::var(v).map_err(|_| {
                EngineError::Failed(format!(
                    "profile placeholder `{{{key}}}`: environment variable {v} is not set"
                ))
            })?)
        } else {
            vals.get(key).cloned()
        };
        out += &v.ok_or_else(|| {
            EngineError::Failed(format!(
                "placeholder `{{{key}}}` has no value for this request"
            ))
        })?;
        rest = &rest[i + j + 1..];
    }
    out += rest;
    Ok(out)
}

pub struct ProfileEngine {
    pub profile: Profile,
    pub path: PathBuf,
    caps: BTreeSet<Capability>,
    scratch: crate::interrupt::ScratchDir,
    calls: u64,
}

impl ProfileEngine {
    /// Load the profile for a run; every environment variable it reads must be set.
    pub fn new(path: &Path) -> anyhow::Result<ProfileEngine> {
        let profile = Profile::load(path)?;
        let unset = profile.unset_environment();
        if !unset.is_empty() {
            bail!(
                "{}: the profile reads environment variable(s) {} (`{{env.NAME}}`), which are not set",
                path.display(),
                unset.join(", ")
            );
        }
        let (caps, _) = declared_capabilities(profile.capabilities.iter().map(String::as_str));
        let scratch = crate::interrupt::ScratchDir::new("ds41-profile-")?;
        Ok(ProfileEngine {
            profile,
            path: path.to_path_buf(),
            caps,
            scratch,
            calls: 0,
        })
    }

    fn out_dir(&mut self) -> Result<PathBuf, EngineError> {
        self.calls += 1;
        let d = self.scratch.path().join(format!("call-{}", self.calls));
        std::fs::create_dir_all(&d)
            .map_err(|e| EngineError::Failed(format!("{}: {e}", d.display())))?;
        Ok(d)
    }

    /// Run one command in its own process group under `timeout` (see `engine_process`).
    /// Exit 0 gives its stdout, which must be UTF-8; an exit code the profile declares in
    /// `refusal_exit_codes` is a refusal; any other exit, a signal or overrunning the
    /// timeout (the group is killed) is a failure named as such, with the stderr tail.
    fn exec(
        &self,
        argv: &[String],
        env: &BTreeMap<String, String>,
        timeout: Duration,
    ) -> EngineResult<String> {
        let (prog, args) = argv
            .split_first()
            .ok_or_else(|| EngineError::Failed("empty command".into()))?;
        let mut cmd = Command::new(prog);
        cmd.args(args).envs(env);
        let deadline = Instant::now() + timeout;
        let mut p = EngineProcess::spawn(&mut cmd, false)
            .map_err(|e| EngineError::Crashed(format!("cannot run `{prog}`: {e}")))?;
        let run = p.run_to_completion(deadline);
        let shown = argv.join(" ");
        let tail = p.stderr_tail();
        let done = match run {
            Ok(done) => done,
            Err(RunError::Timeout) => return Err(EngineError::Timeout(timeout, None)),
            Err(RunError::StdoutOverBudget(n)) => {
                return Err(EngineError::Garbage(format!(
                    "`{shown}` wrote more than {} MiB on stdout (killed){tail}",
                    n >> 20
                )))
            }
            Err(RunError::LeftoverHoldsStdout(how)) => {
                return Err(EngineError::Failed(format!(
                    "`{shown}` {how} but left a process holding its stdout open (its process \
                     group was killed){tail}"
                )))
            }
            Err(RunError::Io(e)) => {
                return Err(EngineError::Crashed(format!(
                    "`{shown}`: reading its stdout: {e}{tail}"
                )))
            }
        };
        match done.status.code() {
            Some(0) => String::from_utf8(done.stdout).map_err(|e| {
                let problem = utf8_problem(e.as_bytes()).unwrap_or_default();
                EngineError::Garbage(format!(
                    "`{shown}` exited with status 0 but its stdout is {problem}"
                ))
            }),
            Some(c) if self.profile.refusal_exit_codes.contains(&c) => Err(EngineError::Refused(
                format!("`{shown}` exited with status {c} (a declared refusal){tail}"),
            )),
            Some(c) => Err(EngineError::Crashed(format!(
                "`{shown}` exited with status {c}, not a declared refusal exit code ({}){tail}",
                self.declared_refusals()
            ))),
            None => Err(EngineError::Crashed(format!(
                "`{shown}` {}{tail}",
                describe_status(done.status)
            ))),
        }
    }

    fn declared_refusals(&self) -> String {
        match self.profile.refusal_exit_codes.as_slice() {
            [] => "the profile declares none".into(),
            codes => format!("declared: {codes:?}"),
        }
    }

    fn prepare(
        &self,
        command: &[String],
        op_env: &BTreeMap<String, String>,
        vals: &BTreeMap<&str, String>,
    ) -> EngineResult<(Vec<String>, BTreeMap<String, String>)> {
        let argv = command
            .iter()
            .map(|t| fill(t, vals, &self.profile.vars))
            .collect::<Result<Vec<_>, _>>()?;
        let mut env = BTreeMap::new();
        for (k, v) in self.profile.env.iter().chain(op_env.iter()) {
            env.insert(k.clone(), fill(v, vals, &self.profile.vars)?);
        }
        Ok((argv, env))
    }
}

impl Engine for ProfileEngine {
    fn identity(&self) -> EngineIdentity {
        EngineIdentity {
            driver: format!("profile: {}", self.path.display()),
            ..self.profile.engine.clone()
        }
    }

    fn capabilities(&self) -> BTreeSet<Capability> {
        self.caps.clone()
    }

    fn load(&mut self, req: &LoadRequest, timeout: Duration) -> EngineResult<()> {
        self.need(Capability::Load)?;
        let op = self.profile.load.clone().expect("validated");
        let out_dir = self.out_dir()?;
        let vals = BTreeMap::from([
            ("model", req.model.display().to_string()),
            ("out_dir", out_dir.display().to_string()),
        ]);
        let (argv, env) = self.prepare(&op.command, &op.env, &vals)?;
        self.exec(&argv, &env, timeout).map(|_| ())
    }

    fn tokenize(
        &mut self,
        req: &TokenizeRequest,
        timeout: Duration,
    ) -> EngineResult<Vec<Vec<u32>>> {
        self.need(Capability::Tokenize)?;
        let op = self.profile.tokenize.clone().expect("validated");
        let out_dir = self.out_dir()?;
        let started = Instant::now();
        let mut all = Vec::with_capacity(req.texts.len());
        for text in &req.texts {
            let vals = BTreeMap::from([
                ("model", req.tokenizer.display().to_string()),
                ("tokenizer", req.tokenizer.display().to_string()),
                ("out_dir", out_dir.display().to_string()),
                ("text", text.clone()),
                ("markup", req.markup.to_string()),
            ]);
            let (argv, env) = self.prepare(&op.command, &op.env, &vals)?;
            let left = timeout.saturating_sub(started.elapsed());
            let out = self.exec(&argv, &env, left)?;
            let line = out.lines().next().unwrap_or("").trim().to_string();
            let ids: Vec<u32> = match op.stdout {
                IdsOutput::JsonIds => serde_json::from_str(&line)
                    .map_err(|e| EngineError::Garbage(format!("ids line {line:?}: {e}")))?,
                IdsOutput::CountThenIds => {
                    let nums: Vec<u32> = line
                        .split_whitespace()
                        .map(|x| {
                            x.parse().map_err(|_| {
                                EngineError::Garbage(format!(
                                    "ids line {line:?}: `{x}` is not an id"
                                ))
                            })
                        })
                        .collect::<Result<_, _>>()?;
                    let (n, ids) = nums
                        .split_first()
                        .ok_or_else(|| EngineError::Garbage("empty ids line".into()))?;
                    if *n as usize != ids.len() {
                        return Err(EngineError::Garbage(format!(
                            "ids line {line:?}: count {n} but {} ids",
                            ids.len()
                        )));
                    }
                    ids.to_vec()
                }
            };
            all.push(ids);
        }
        Ok(all)
    }

    fn render(&mut self, req: &RenderRequest, timeout: Duration) -> EngineResult<String> {
        self.need(Capability::Render)?;
        let op = self.profile.render.clone().expect("validated");
        let out_dir = self.out_dir()?;
        let conv = out_dir.join("conversation.json");
        std::fs::write(&conv, req.conversation.to_string())
            .map_err(|e| EngineError::Failed(e.to_string()))?;
        let vals = BTreeMap::from([
            ("out_dir", out_dir.display().to_string()),
            ("model", String::new()),
            ("conversation", conv.display().to_string()),
            (
                "thinking_mode",
                req.thinking_mode.clone().unwrap_or_else(|| "chat".into()),
            ),
        ]);
        let (argv, env) = self.prepare(&op.command, &op.env, &vals)?;
        self.exec(&argv, &env, timeout)
    }

    fn parse(&mut self, req: &ParseRequest, timeout: Duration) -> EngineResult<serde_json::Value> {
        self.need(Capability::Parse)?;
        let op = self.profile.parse.clone().expect("validated");
        let out_dir = self.out_dir()?;
        let file = out_dir.join("completion.txt");
        std::fs::write(&file, &req.completion).map_err(|e| EngineError::Failed(e.to_string()))?;
        let vals = BTreeMap::from([
            ("out_dir", out_dir.display().to_string()),
            ("model", String::new()),
            ("completion", file.display().to_string()),
            ("thinking", req.thinking.to_string()),
            ("tolerant", req.tolerant.to_string()),
        ]);
        let (argv, env) = self.prepare(&op.command, &op.env, &vals)?;
        let out = self.exec(&argv, &env, timeout)?;
        serde_json::from_str(out.trim())
            .map_err(|e| EngineError::Garbage(format!("parse output is not JSON: {e}")))
    }

    fn forward(&mut self, req: &ForwardRequest, timeout: Duration) -> EngineResult<()> {
        self.need(Capability::Forward)?;
        if req.save_state.is_some() || req.load_state.is_some() {
            self.need(Capability::State)?;
        }
        if !req.images.is_empty() {
            // A command template has no placeholder for image files.
            return Err(EngineError::Unsupported(
                Capability::VisionForward,
                Some("command profiles pass no image files".into()),
            ));
        }
        let op = self.profile.forward.clone().expect("validated");
        let out_dir = self.out_dir()?;
        let ids: Vec<String> = req.tokens.iter().map(|t| t.to_string()).collect();
        let path = |p: &Option<PathBuf>| {
            p.as_ref()
                .map(|p| p.display().to_string())
                .unwrap_or_default()
        };
        let vals = BTreeMap::from([
            ("model", req.model.display().to_string()),
            ("out_dir", out_dir.display().to_string()),
            ("out", req.out.display().to_string()),
            ("ids_csv", ids.join(",")),
            ("ids_space", ids.join(" ")),
            ("n_tokens", req.tokens.len().to_string()),
            (
                "prefill",
                req.prefill
                    .map(|p| p.to_string())
                    .unwrap_or_else(|| req.tokens.len().to_string()),
            ),
            ("numerics", req.numerics.as_str().to_string()),
            ("index_k", req.index_k.as_str().to_string()),
            ("save_state", path(&req.save_state)),
            ("load_state", path(&req.load_state)),
        ]);
        let (argv, env) = self.prepare(&op.command, &op.env, &vals)?;
        self.exec(&argv, &env, timeout)?;
        let mut trace = TraceFile::default();
        let mut dims = None;
        let mut dims = || -> EngineResult<crate::families::residual::Dims> {
            if dims.is_none() {
                dims = Some(
                    crate::families::residual::model_dims(&req.model)
                        .map_err(|e| EngineError::Failed(format!("{e:#}")))?,
                );
            }
            Ok(dims.unwrap())
        };
        let n = req.tokens.len();
        for o in op.outputs.values() {
            let file = PathBuf::from(fill(&o.file, &vals, &self.profile.vars)?);
            let garbage = |e: anyhow::Error| EngineError::Garbage(format!("{e:#}"));
            match o.layout {
                Layout::Trace => {
                    regular_file_len(&file).map_err(garbage)?;
                    let t = TraceFile::read(&file).map_err(|e| garbage(e.into()))?;
                    trace.tensors.extend(t.tensors);
                    trace.metadata.extend(t.metadata);
                }
                Layout::LastTokenF32 => {
                    let v = read_raw_f32(&file, dims()?.vocab).map_err(garbage)?;
                    trace
                        .tensors
                        .insert("logits".into(), TraceTensor::f32(vec![1, v.len()], v));
                    trace.tensors.insert(
                        "logits_positions".into(),
                        TraceTensor::i64(vec![1], vec![n as i64 - 1]),
                    );
                }
                Layout::StepsF32 => {
                    let vocab = dims()?.vocab;
                    let (steps, v) = read_raw_f32_rows(&file, vocab).map_err(garbage)?;
                    trace
                        .tensors
                        .insert("logits".into(), TraceTensor::f32(vec![steps, vocab], v));
                    let first = (n - steps) as i64;
                    trace.tensors.insert(
                        "logits_positions".into(),
                        TraceTensor::i64(vec![steps], (first..n as i64).collect()),
                    );
                }
                Layout::LastTokenLayersF32 | Layout::TokensLayersF32 => {
                    let d = dims()?;
                    let rows = if o.layout == Layout::TokensLayersF32 {
                        n
                    } else {
                        1
                    };
                    let v = read_raw_f32(&file, rows * d.layers * d.hc * d.dim).map_err(garbage)?;
                    trace.tensors.insert(
                        "residual".into(),
                        TraceTensor::f32(vec![rows, d.layers, d.hc, d.dim], v),
                    );
                }
                Layout::WasteRoute => {
                    let d = dims()?;
                    let t = parse_waste_route(&file, n, d.layers).map_err(garbage)?;
                    trace.tensors.insert("experts".into(), t);
                }
            }
        }
        trace
            .metadata
            .insert("engine".into(), self.profile.engine.name.clone());
        trace
            .write(&req.out)
            .map_err(|e| EngineError::Failed(format!("{e:#}")))
    }
}

/// WASTE_DUMP_ROUTE lines `pos layer id*K w*K lookahead*K` -> experts [tokens, layers, K]
/// (a missing (pos, layer) is -1, i.e. "no decision").
fn parse_waste_route(path: &Path, tokens: usize, layers: usize) -> anyhow::Result<TraceTensor> {
    // A line per (token, layer) of at most a few hundred bytes.
    let cap = (tokens * layers) as u64 * 4096 + 4096;
    let len = regular_file_len(path)?;
    if len > cap {
        bail!(
            "{}: {len} bytes, more than a route dump of {tokens} tokens can take",
            path.display()
        );
    }
    let text = std::fs::read_to_string(path).map_err(|e| anyhow!("{}: {e}", path.display()))?;
    let mut rows: Vec<(usize, usize, Vec<i64>)> = Vec::new();
    for (i, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 5 || !(f.len() - 2).is_multiple_of(3) {
            bail!(
                "{} line {}: expected `pos layer id*K w*K lookahead*K`",
                path.display(),
                i + 1
            );
        }
        let k = (f.len() - 2) / 3;
        let num = |s: &str| {
            s.parse::<i64>()
                .map_err(|_| anyhow!("{} line {}: `{s}` is not an integer", path.display(), i + 1))
        };
        let (pos, layer) = (num(f[0])? as usize, num(f[1])? as usize);
        if pos >= tokens || layer >= layers {
            bail!(
                "{} line {}: position {pos} / layer {layer} out of range",
                path.display(),
                i + 1
            );
        }
        rows.push((
            pos,
            layer,
            f[2..2 + k]
                .iter()
                .map(|s| num(s))
                .collect::<Result<_, _>>()?,
        ));
    }
    let k = rows
        .first()
        .map(|r| r.2.len())
        .ok_or_else(|| anyhow!("{}: empty route dump", path.display()))?;
    let mut v = vec![-1i64; tokens * layers * k];
    for (pos, layer, ids) in rows {
        if ids.len() != k {
            bail!("{}: rows with different K", path.display());
        }
        v[(pos * layers + layer) * k..(pos * layers + layer + 1) * k].copy_from_slice(&ids);
    }
    Ok(TraceTensor::i64(vec![tokens, layers, k], v))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repository_waste_profile_is_valid() {
        let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("profiles/waste-test-forward.yaml");
        let prof = Profile::load(&p).unwrap();
        assert!(prof.capabilities.contains(&"forward".to_string()));
    }

    #[test]
    fn unknown_placeholder_is_a_config_error() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("p.yaml");
        std::fs::write(&p, "engine: {name: x, version: '1'}\ncapabilities: [load]\nload:\n  command: [true, '{modle}']\n").unwrap();
        let e = Profile::load(&p).unwrap_err().to_string();
        assert!(e.contains("p.yaml") && e.contains("{modle}"), "{e}");
        std::fs::write(
            &p,
            "engine: {name: x, version: '1'}\ncapabilities: [forward]\nload:\n  command: [true]\n",
        )
        .unwrap();
        let e = Profile::load(&p).unwrap_err().to_string();
        assert!(e.contains("forward"), "{e}");
    }

    #[test]
    fn load_exit_status_maps_to_accept_refuse_and_timeout() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("p.yaml");
        std::fs::write(
            &p,
            "engine: {name: x, version: '1'}\ncapabilities: [load]\nrefusal_exit_codes: [3]\nload:\n  command: [sh, -c, 'case {model} in *good*) exit 0;; *slow*) sleep 5;; *) echo \"bad magic in {model}\" >&2; exit 3;; esac']\n",
        )
        .unwrap();
        let mut e = ProfileEngine::new(&p).unwrap();
        let t = Duration::from_secs(10);
        assert_eq!(
            e.load(
                &LoadRequest {
                    model: "/x/good".into(),
                    verify: false,
                },
                t
            ),
            Ok(())
        );
        match e.load(
            &LoadRequest {
                model: "/x/broken".into(),
                verify: false,
            },
            t,
        ) {
            Err(EngineError::Refused(m)) => assert!(m.contains("bad magic in /x/broken"), "{m}"),
            other => panic!("{other:?}"),
        }
        let r = e.load(
            &LoadRequest {
                model: "/x/slow".into(),
                verify: false,
            },
            Duration::from_millis(200),
        );
        assert!(matches!(r, Err(EngineError::Timeout(..))), "{r:?}");
    }

    #[test]
    fn waste_route_dump_becomes_expert_ids() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("r.txt");
        std::fs::write(
            &f,
            "0 0 3 1 0.5 0.5 0 0\n0 1 2 0 0.6 0.4 0 0\n1 0 1 2 0.7 0.3 0 0\n",
        )
        .unwrap();
        let t = parse_waste_route(&f, 2, 2).unwrap();
        assert_eq!(t.shape, vec![2, 2, 2]);
        assert_eq!(t.as_i64(), vec![3, 1, 2, 0, 1, 2, -1, -1]);
    }
}
