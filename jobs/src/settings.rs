//! `[job]`: the built-in jobs' settings. The cluster file is one file every node reads, but only
//! the job reads this table: `pushpull_proto::Config` carries it as a TOML table, and
//! [`JobConfig::of`] turns it into settings, checked, with errors that name the key
//! (`job.model`), the value and what is allowed. Editing a default here rebuilds the jobs, not
//! the protocol, the scheduler or the servers.

use pushpull_proto::config::ConfigError;
use pushpull_proto::Config;
use serde::{Deserialize, Serialize};

/// `[job]`: the built-in job (`pushpull-worker` without user code; `pushpull local`).
///
/// `kind = "benchmark"` uses `rounds`, `warmup`, `scale` and `check`; `kind = "train"` uses the
/// training keys (`model` .. `lr_schedule`). Keys of the other kind are accepted and checked
/// but not used, so one file can switch between the two.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct JobConfig {
    /// `kind`: `benchmark` (push_pull of a ResNet-50-like tensor set on random data, every
    /// result checked against an independent sum; the default when `[job]` has no `kind`) or
    /// `train` (data-parallel SGD of a candle MLP on a synthetic classification task, the
    /// gradients push_pulled with each tensor's compressor; `configs/local.toml` sets it).
    #[serde(default = "default_job_kind")]
    pub kind: String,
    /// `rounds`: push_pull rounds after warm-up (default 10).
    #[serde(default = "default_rounds")]
    pub rounds: u32,
    /// `warmup`: rounds run before timing starts (default 1).
    #[serde(default = "default_warmup")]
    pub warmup: u32,
    /// `scale`: fraction of the ResNet-50 tensor set's element count (default 1.0 =
    /// 25.6 M elements, 161 tensors); every tensor keeps at least one element.
    #[serde(default = "default_scale")]
    pub scale: f64,
    /// `check`: verify every result against the independently computed sum (default true).
    #[serde(default = "default_true")]
    pub check: bool,
    /// `priority` (benchmark): `forward` (tensor i of the set is declared with priority -i, so
    /// the first layers' results come first, as the next forward pass needs them; the
    /// default) or `none` (every tensor priority 0: frames leave in the order they are
    /// issued, the last layer first, as a backward pass issues them).
    #[serde(default = "default_job_priority")]
    pub priority: String,
    /// `issue` (benchmark): how a round's push_pull calls are made, all at once: `group` (one
    /// `push_pull_group_into` of every tensor, whose chunks leave in priority order; the
    /// default), or separate calls, `backward` (the last layer first, as a backward pass
    /// produces the gradients) or `forward` (the first layer first). With separate calls, which
    /// frames a worker sends first depends on how its calls and its compression interleave with
    /// its sender, so workers may start a round in different orders (BENCHMARKS.md at 60710fe,
    /// "The order of simultaneous calls").
    #[serde(default = "default_job_issue")]
    pub issue: String,
    /// `buffers` (benchmark): where each worker's tensors live: `host` (host memory, the
    /// default), `device` (GPU memory, compressed where `worker.device` says: on the GPU by
    /// default, so only compressed payloads cross PCIe; needs a usable CUDA GPU) or `emulated`
    /// (the host-emulated device of the worker crate, which runs the device path's kernels on
    /// the CPU: the device data path without a GPU, for tests). Device buffers are reduced in
    /// place: with `issue = group`, in one `push_pull_group_device` call (one batch of every
    /// chunk on the device), else with one `push_pull_device` call per tensor in `issue`'s
    /// order, all before any is awaited.
    #[serde(default = "default_job_buffers")]
    pub buffers: String,
    /// `skip_push_pull` (train): train without any push_pull, each worker alone on its shard
    /// (for timing the compute alone; default false).
    #[serde(default)]
    pub skip_push_pull: bool,
    /// `model` (train): `mlp` (ReLU layers of widths `hidden`, default) or `logistic`
    /// (multinomial logistic regression: one linear layer, the baseline).
    #[serde(default = "default_model")]
    pub model: String,
    /// `steps` (train): SGD steps, one push_pull of every gradient tensor each (default 300).
    #[serde(default = "default_steps")]
    pub steps: u32,
    /// `batch_size` (train): samples per worker per step (default 64).
    #[serde(default = "default_batch_size")]
    pub batch_size: u32,
    /// `lr` (train): peak learning rate of SGD (default 0.1).
    #[serde(default = "default_lr")]
    pub lr: f64,
    /// `lr_schedule` (train): `cosine` (decay from `lr` to 0 over `steps`, default) or
    /// `constant`.
    #[serde(default = "default_lr_schedule")]
    pub lr_schedule: String,
    /// `momentum` (train): SGD momentum in [0, 1) (default 0.9). Ignored (0) for tensors whose
    /// parameter map has `momentum = "nesterov"`: the compressor's momentum owns it then.
    #[serde(default = "default_momentum")]
    pub momentum: f64,
    /// `input_dim` (train): input features (default 16).
    #[serde(default = "default_input_dim")]
    pub input_dim: u32,
    /// `hidden` (train, mlp): widths of the hidden layers (default [512, 512]).
    #[serde(default = "default_hidden")]
    pub hidden: Vec<u32>,
    /// `classes` (train): number of classes (default 10).
    #[serde(default = "default_classes")]
    pub classes: u32,
    /// `teacher_hidden` (train): hidden units of the random teacher network whose argmax labels
    /// the data (`argmax(W2 · (|W1 · x| − √(2/π)))`, see [`crate::train::data`];
    /// default 8).
    #[serde(default = "default_teacher_hidden")]
    pub teacher_hidden: u32,
    /// `train_samples` (train): training set size, sharded across workers by rank (sample i
    /// goes to worker i mod num_workers; default 32768).
    #[serde(default = "default_train_samples")]
    pub train_samples: u32,
    /// `test_samples` (train): held-out test set size, labelled by the teacher without noise
    /// (default 4096).
    #[serde(default = "default_test_samples")]
    pub test_samples: u32,
    /// `label_noise` (train): fraction in [0, 1) of training labels replaced by a uniformly
    /// random class (default 0.1).
    #[serde(default = "default_label_noise")]
    pub label_noise: f64,
    /// `eval_every` (train): also evaluate on the test set every this many steps (0: only at
    /// the end; default 0).
    #[serde(default)]
    pub eval_every: u32,
}

impl Default for JobConfig {
    fn default() -> Self {
        JobConfig {
            kind: default_job_kind(),
            rounds: default_rounds(),
            warmup: default_warmup(),
            scale: default_scale(),
            check: true,
            priority: default_job_priority(),
            issue: default_job_issue(),
            buffers: default_job_buffers(),
            skip_push_pull: false,
            model: default_model(),
            steps: default_steps(),
            batch_size: default_batch_size(),
            lr: default_lr(),
            lr_schedule: default_lr_schedule(),
            momentum: default_momentum(),
            input_dim: default_input_dim(),
            hidden: default_hidden(),
            classes: default_classes(),
            teacher_hidden: default_teacher_hidden(),
            train_samples: default_train_samples(),
            test_samples: default_test_samples(),
            label_noise: default_label_noise(),
            eval_every: 0,
        }
    }
}

impl JobConfig {
    /// Checks the `[job]` keys (those of both kinds); errors name the key, the value and what
    /// is allowed. `num_workers` bounds `train_samples` (every worker needs a sample).
    fn validate(&self, num_workers: u32, origin: &str) -> Result<(), ConfigError> {
        let bad = |key: &str, value: String, allowed: &str| ConfigError::Invalid {
            origin: origin.to_string(),
            key: key.to_string(),
            value,
            allowed: allowed.to_string(),
        };
        let one_of = |key: &str, value: &str, allowed: &[&str]| {
            if allowed.contains(&value) {
                Ok(())
            } else {
                let list: Vec<String> = allowed.iter().map(|a| format!("{a:?}")).collect();
                Err(bad(
                    key,
                    format!("{value:?}"),
                    &format!("one of {}", list.join(", ")),
                ))
            }
        };
        let range_u32 = |key: &str, v: u32, lo: u32, hi: u32| {
            if (lo..=hi).contains(&v) {
                Ok(())
            } else {
                Err(bad(
                    key,
                    v.to_string(),
                    &format!("an integer in {lo}..={hi}"),
                ))
            }
        };
        one_of("job.kind", &self.kind, &["benchmark", "train"])?;
        one_of("job.model", &self.model, &["mlp", "logistic"])?;
        one_of("job.priority", &self.priority, &["forward", "none"])?;
        one_of("job.issue", &self.issue, &["group", "backward", "forward"])?;
        one_of(
            "job.buffers",
            &self.buffers,
            &["host", "device", "emulated"],
        )?;
        one_of(
            "job.lr_schedule",
            &self.lr_schedule,
            &["cosine", "constant"],
        )?;
        range_u32("job.steps", self.steps, 1, 10_000_000)?;
        range_u32("job.batch_size", self.batch_size, 1, 65_536)?;
        range_u32("job.input_dim", self.input_dim, 1, 65_536)?;
        range_u32("job.classes", self.classes, 2, 65_536)?;
        range_u32("job.teacher_hidden", self.teacher_hidden, 1, 65_536)?;
        range_u32("job.test_samples", self.test_samples, 1, 10_000_000)?;
        range_u32(
            "job.train_samples",
            self.train_samples,
            num_workers.max(1),
            10_000_000,
        )?;
        if self.model == "mlp" && self.hidden.is_empty() {
            return Err(bad(
                "job.hidden",
                "[]".into(),
                "at least one hidden width for model = \"mlp\" (use model = \"logistic\" for \
                 no hidden layer)",
            ));
        }
        for &h in &self.hidden {
            if !(1..=65_536).contains(&h) {
                return Err(bad(
                    "job.hidden",
                    format!("{:?}", self.hidden),
                    "widths in 1..=65536",
                ));
            }
        }
        let data_elements =
            (self.train_samples as u64 + self.test_samples as u64) * self.input_dim as u64;
        if data_elements > 1 << 28 {
            return Err(bad(
                "job.train_samples",
                self.train_samples.to_string(),
                &format!(
                    "(train_samples + test_samples) * input_dim must be at most 268435456 \
                     elements (here {data_elements})"
                ),
            ));
        }
        if !(self.scale > 0.0 && self.scale <= 64.0) {
            return Err(bad(
                "job.scale",
                self.scale.to_string(),
                "a number in (0, 64]",
            ));
        }
        if !(self.lr.is_finite() && self.lr > 0.0 && self.lr <= 100.0) {
            return Err(bad("job.lr", self.lr.to_string(), "a number in (0, 100]"));
        }
        if !(self.momentum.is_finite() && (0.0..1.0).contains(&self.momentum)) {
            return Err(bad(
                "job.momentum",
                self.momentum.to_string(),
                "a number in [0, 1)",
            ));
        }
        if !(self.label_noise.is_finite() && (0.0..1.0).contains(&self.label_noise)) {
            return Err(bad(
                "job.label_noise",
                self.label_noise.to_string(),
                "a fraction in [0, 1)",
            ));
        }
        Ok(())
    }
}

impl JobConfig {
    /// The `[job]` table of `config` (absent keys at their defaults), checked against the
    /// cluster's `num_workers`; errors name `origin` (the file) and the key.
    pub fn from_config(config: &Config, origin: &str) -> Result<JobConfig, ConfigError> {
        let job = JobConfig::deserialize(toml::Value::Table(config.job.clone())).map_err(|e| {
            ConfigError::Parse {
                origin: origin.to_string(),
                message: format!("in [job]: {}", e.to_string().trim_end()),
            }
        })?;
        job.validate(config.cluster.num_workers, origin)?;
        Ok(job)
    }

    /// [`JobConfig::from_config`] of a cluster file already checked by its loader
    /// ([`load`]), or made in code; errors name "the cluster file".
    pub fn of(config: &Config) -> Result<JobConfig, ConfigError> {
        JobConfig::from_config(config, "the cluster file")
    }

    /// Writes these settings as `config`'s `[job]` table (every key, so a cluster file written
    /// from `config` says what runs).
    pub fn store(&self, config: &mut Config) {
        config.job = toml::Table::try_from(self).expect("JobConfig is a TOML table");
    }

    /// Changes `config`'s job settings with `f`, checked afterwards.
    pub fn edit(
        config: &mut Config,
        f: impl FnOnce(&mut JobConfig),
    ) -> Result<JobConfig, ConfigError> {
        let mut job = JobConfig::of(config)?;
        f(&mut job);
        job.store(config);
        JobConfig::of(config)
    }
}

/// Reads the cluster file at `path` and its `[job]` table: both checked, errors naming the
/// file and the key.
pub fn load(path: &std::path::Path) -> Result<(Config, JobConfig), ConfigError> {
    let config = Config::from_file(path)?;
    let job = JobConfig::from_config(&config, &path.display().to_string())?;
    Ok((config, job))
}

fn default_job_priority() -> String {
    "forward".to_string()
}
fn default_job_buffers() -> String {
    "host".into()
}

fn default_job_issue() -> String {
    "group".to_string()
}
fn default_job_kind() -> String {
    "benchmark".to_string()
}
fn default_model() -> String {
    "mlp".to_string()
}
fn default_steps() -> u32 {
    300
}
fn default_batch_size() -> u32 {
    64
}
fn default_lr() -> f64 {
    0.1
}
fn default_lr_schedule() -> String {
    "cosine".to_string()
}
fn default_momentum() -> f64 {
    0.9
}
fn default_input_dim() -> u32 {
    16
}
fn default_hidden() -> Vec<u32> {
    vec![512, 512]
}
fn default_classes() -> u32 {
    10
}
fn default_teacher_hidden() -> u32 {
    8
}
fn default_train_samples() -> u32 {
    32_768
}
fn default_test_samples() -> u32 {
    4_096
}
fn default_label_noise() -> f64 {
    0.1
}
fn default_rounds() -> u32 {
    10
}
fn default_warmup() -> u32 {
    1
}
fn default_scale() -> f64 {
    1.0
}
fn default_true() -> bool {
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINIMAL: &str =
        "[cluster]\nscheduler = \"127.0.0.1:0\"\nnum_workers = 2\nnum_servers = 1\n";

    fn parse(text: &str) -> Result<JobConfig, String> {
        let c = Config::from_toml_str(text, "t.toml").map_err(|e| e.to_string())?;
        JobConfig::from_config(&c, "t.toml").map_err(|e| e.to_string())
    }

    fn refused(text: &str, needles: &[&str]) {
        let e = parse(text).unwrap_err();
        for n in needles {
            assert!(e.contains(n), "{n:?} not in: {e}");
        }
        assert!(e.contains("t.toml"), "names the file: {e}");
    }

    #[test]
    fn defaults_without_a_table() {
        assert_eq!(parse(MINIMAL).unwrap(), JobConfig::default());
        assert_eq!(JobConfig::default().kind, "benchmark");
    }

    #[test]
    fn buffers_values() {
        assert_eq!(parse(MINIMAL).unwrap().buffers, "host");
        for v in ["device", "emulated"] {
            let text = format!("{MINIMAL}\n[job]\nbuffers = {v:?}\n");
            assert_eq!(parse(&text).unwrap().buffers, v);
        }
        refused(
            &format!("{MINIMAL}\n[job]\nbuffers = \"gpu\"\n"),
            &["job.buffers", "gpu", "emulated"],
        );
    }

    #[test]
    fn issue_values() {
        assert_eq!(parse(MINIMAL).unwrap().issue, "group");
        let text = format!("{MINIMAL}\n[job]\nissue = \"forward\"\n");
        assert_eq!(parse(&text).unwrap().issue, "forward");
        refused(
            &format!("{MINIMAL}\n[job]\nissue = \"sideways\"\n"),
            &["job.issue", "sideways", "group"],
        );
    }

    #[test]
    fn bad_keys_and_values_are_named() {
        refused(&format!("{MINIMAL}\n[job]\nrounds = -1\n"), &["rounds"]);
        refused(
            &format!("{MINIMAL}\n[job]\nrunds = 3\n"),
            &["[job]", "runds"],
        );
        refused(&format!("{MINIMAL}\n[job]\nscale = 0.0\n"), &["job.scale"]);
        refused(
            &format!("{MINIMAL}\n[job]\ntrain_samples = 1\n"),
            &["job.train_samples", "1"],
        );
        refused(
            &format!("{MINIMAL}\n[job]\nhidden = []\n"),
            &["job.hidden", "[]"],
        );
    }

    #[test]
    fn store_and_edit_round_trip() {
        let mut c = Config::from_toml_str(MINIMAL, "t.toml").unwrap();
        let j = JobConfig::edit(&mut c, |j| {
            j.kind = "train".into();
            j.hidden = vec![7, 3];
        })
        .unwrap();
        assert_eq!(JobConfig::of(&c).unwrap(), j);
        // Through the file's text, as the launcher writes it for every node.
        let text = toml::to_string(&c).unwrap();
        assert_eq!(parse(&text).unwrap(), j);
        let e = JobConfig::edit(&mut c, |j| j.lr = -1.0)
            .unwrap_err()
            .to_string();
        assert!(e.contains("job.lr"), "{e}");
    }
}
