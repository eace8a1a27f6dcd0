"""Every unlearning objective, one function each, plus the table of paper defaults.

Conventions (shapes in comments):
- `logits` are the model's next-token logits at supervised positions only, (B, K, V), upcast to fp32.
  train.py keeps the last K positions of each left-padded row, so position k of row b predicts
  `labels[b, k]`; -100 marks positions that are not supervised (padding, shorter answers).
- `weights` (B, K) are per-position weights (0 where labels are -100); for uniform methods each row's
  weights are 1 / (number of supervised tokens), so a weighted sum is a per-example token mean.
- A loss function receives `out`, a dict with the tensors its METHODS row asks for (views "forget",
  "refusal", "mixed", "retain"; reference outputs under "ref_<view>"), and `hp`, the resolved
  hyperparameters. It returns per-example forget and retain losses, shape (B,), and a dict of detached
  0-dim diagnostic tensors (train.py reads them once per optimizer step, so the GPU never waits
  mid-step). train.py combines the losses as lambda_f * L_f + lambda_r * L_r (JensUn++ adds alpha).

A new method is one function here plus one row in METHODS (and one in HPARAMS for its defaults).
"""
import math

import torch
import torch.nn.functional as F

IGNORE = -100
LOG2 = math.log(2.0)


# ----------------------------------------------------------------------------------------------
# Building blocks

def token_logprobs(logits, labels):
    """log p(label) at every position, (B, K); 0 where the label is IGNORE."""
    safe = labels.clamp(min=0)
    lse = torch.logsumexp(logits, dim=-1)                                   # (B, K)
    picked = logits.gather(-1, safe.unsqueeze(-1)).squeeze(-1)              # (B, K)
    return (picked - lse) * (labels != IGNORE)


def sequence_nll(logits, labels, weights):
    """Weighted token NLL per example, (B,): with uniform weights the mean NLL of the answer."""
    return -(token_logprobs(logits, labels) * weights).sum(-1)


def summed_logprob(logits, labels):
    """S = sum of answer-token log-probs per example, (B,) (the DPO/NPO sequence score)."""
    return token_logprobs(logits, labels).sum(-1)


def js_to_onehot(logp_target):
    """JS(p || delta_y) from log p_y alone: log 2 + (p log p - (1 + p) log(1 + p)) / 2.

    With m = (p + delta_y) / 2: KL(p||m) = (1-p) log 2 + p log(2p / (1+p)) and KL(delta||m) =
    log(2 / (1+p)); their mean simplifies to the expression above. No vocab-size tensor is needed.
    """
    p = logp_target.exp()
    return LOG2 + 0.5 * (p * logp_target - (1 + p) * torch.log1p(p))


def js_divergence(logits_p, logits_q):
    """General JS(p || q) per position over the vocabulary, (B, K); natural log."""
    logp, logq = F.log_softmax(logits_p, -1), F.log_softmax(logits_q, -1)
    logm = torch.logaddexp(logp, logq) - LOG2
    kl_pm = (logp.exp() * (logp - logm)).sum(-1)
    kl_qm = (logq.exp() * (logq - logm)).sum(-1)
    return 0.5 * (kl_pm + kl_qm)


def weighted_sum(per_token, labels, weights):
    return (per_token * weights * (labels != IGNORE)).sum(-1)


def nll_retain(out, hp):
    v = out["retain"]
    return sequence_nll(v["logits"], v["labels"], v["weights"])


# ----------------------------------------------------------------------------------------------
# Objectives

def ga(out, hp):
    """Gradient ascent (Jang et al. 2023): minimise minus the NLL of the forget answers."""
    f = out["forget"]
    nll = sequence_nll(f["logits"], f["labels"], f["weights"])
    loss_r = nll_retain(out, hp) if "retain" in out else None       # only with --lambda-r > 0
    return -nll, loss_r, {"forget_nll": nll.mean().detach()}


def graddiff(out, hp):
    """GradDiff (Liu et al. 2022; TOFU): -NLL(forget) + lambda_r * NLL(retain)."""
    f = out["forget"]
    nll_f = sequence_nll(f["logits"], f["labels"], f["weights"])
    nll_r = nll_retain(out, hp)
    return -nll_f, nll_r, {"forget_nll": nll_f.mean().detach(), "retain_nll": nll_r.mean().detach()}


def dpo(out, hp):
    """DPO for unlearning: preferred = refusal, rejected = original answer, frozen reference.

    L_f = -(2/beta) log sigmoid(beta [(S_theta - S_ref)(refusal) - (S_theta - S_ref)(original)]),
    S the summed answer log-prob (Rafailov et al. 2023, eq. 7, with the 2/beta scale of open-unlearning).
    """
    f, r = out["forget"], out["refusal"]
    win = summed_logprob(r["logits"], r["labels"]) - out["ref_refusal"]["seq_logprob"]
    lose = summed_logprob(f["logits"], f["labels"]) - out["ref_forget"]["seq_logprob"]
    beta = hp["beta"]
    loss_f = -(2.0 / beta) * F.logsigmoid(beta * (win - lose))
    nll_r = nll_retain(out, hp)
    return loss_f, nll_r, {"margin": (win - lose).mean().detach(), "retain_nll": nll_r.mean().detach()}


def npo(out, hp):
    """NPO (Zhang et al. 2024, eq. 3): L_f = -(2/beta) log sigmoid(-beta (S_theta - S_ref)); + retain NLL."""
    f = out["forget"]
    log_ratio = summed_logprob(f["logits"], f["labels"]) - out["ref_forget"]["seq_logprob"]
    beta = hp["beta"]
    loss_f = -(2.0 / beta) * F.logsigmoid(-beta * log_ratio)
    nll_r = nll_retain(out, hp)
    return loss_f, nll_r, {"log_ratio": log_ratio.mean().detach(), "retain_nll": nll_r.mean().detach()}


def simnpo(out, hp):
    """SimNPO (Fan et al. 2024, eq. 6): -(2/beta) log sigmoid(beta (NLL_sum/|y| - delta)); no reference."""
    f = out["forget"]
    n_tokens = (f["labels"] != IGNORE).sum(-1).clamp(min=1)
    mean_nll = -summed_logprob(f["logits"], f["labels"]) / n_tokens
    beta = hp["beta"]
    loss_f = -(2.0 / beta) * F.logsigmoid(beta * (mean_nll - hp["delta"]))
    nll_r = nll_retain(out, hp)
    return loss_f, nll_r, {"forget_nll": mean_nll.mean().detach(), "retain_nll": nll_r.mean().detach()}


def pdu(out, hp):
    """PDU (Entesari et al. 2025): L_f = token mean of (max_v z_v - mean_v z_v)^2, retain NLL.

    The constraint L_r <= eps enters as lambda_r (L_r - eps); train.py keeps lambda_r as a dual variable
    updated by lambda_r <- max(0, lambda_r + eta (L_r - eps)) after a warm-up (pdu_dual_step).
    """
    f = out["forget"]
    z = f["logits"]
    gap = (z.max(-1).values - z.mean(-1)) ** 2                             # (B, K)
    loss_f = weighted_sum(gap, f["labels"], f["weights"])
    nll_r = nll_retain(out, hp)
    return loss_f, nll_r - hp["pdu_eps"], {"logit_gap": loss_f.mean().detach(), "retain_nll": nll_r.mean().detach()}


def rmu(out, hp):
    """RMU (Li et al. 2024, WMDP): steer layer-l activations of forget answers to c = kappa u/|u|;
    keep retain activations equal to the frozen model's. Hidden states come from a hook (train.py)."""
    f, r = out["forget"], out["retain"]
    control = hp["control_vector"].to(f["hidden"].dtype)                    # (d,)
    mask_f = f["labels"] != IGNORE
    mask_r = r["labels"] != IGNORE
    se_f = ((f["hidden"] - control) ** 2).mean(-1)                          # (B, K)
    se_r = ((r["hidden"] - out["ref_retain"]["hidden"]) ** 2).mean(-1)
    loss_f = (se_f * mask_f).sum(-1) / mask_f.sum(-1).clamp(min=1)
    loss_r = (se_r * mask_r).sum(-1) / mask_r.sum(-1).clamp(min=1)
    return loss_f, loss_r, {"forget_mse": loss_f.mean().detach(), "retain_mse": loss_r.mean().detach()}


def undial(out, hp):
    """UNDIAL (Dong et al. 2025): self-distillation towards the reference distribution with the true
    token's logit lowered by beta; L_f = CE(softmax(teacher), p_theta) over answer tokens."""
    f = out["forget"]
    teacher = out["ref_forget"]["logits"].clone()                            # (B, K, V)
    safe = f["labels"].clamp(min=0).unsqueeze(-1)
    teacher.scatter_(-1, safe, teacher.gather(-1, safe) - hp["beta"])
    q = F.softmax(teacher, -1)
    ce = -(q * F.log_softmax(f["logits"], -1)).sum(-1)                       # (B, K)
    loss_f = weighted_sum(ce, f["labels"], f["weights"])
    loss_r = nll_retain(out, hp) if "retain" in out else None       # only with --lambda-r > 0
    return loss_f, loss_r, {"distill_ce": loss_f.mean().detach()}


def _weighted_ascent(out, hp, token_weight):
    f = out["forget"]
    logp = token_logprobs(f["logits"], f["labels"])                         # (B, K)
    w = token_weight(logp.detach().exp())
    loss_f = weighted_sum(w * logp, f["labels"], f["weights"])               # = -mean(w * NLL)
    nll_r = nll_retain(out, hp)
    return loss_f, nll_r, {"forget_logp": (logp * f["weights"]).sum(-1).mean().detach(), "retain_nll": nll_r.mean().detach()}


def wga(out, hp):
    """WGA (Wang et al. 2025): weighted gradient ascent, w_t = p_t^beta (detached); + retain NLL."""
    return _weighted_ascent(out, hp, lambda p: p ** hp["beta"])


def satimp(out, hp):
    """SatImp (Yang et al. 2025): w_t = p_t^beta1 (1 - p_t)^beta2 (detached); otherwise as WGA."""
    return _weighted_ascent(out, hp, lambda p: p ** hp["beta1"] * (1 - p) ** hp["beta2"])


def jensun(out, hp):
    """JensUn (Singh et al. 2025): JS(p_theta || one-hot "No idea") on the refusal tokens,
    JS(p_theta || p_ref) on retain answers, uniform token weights."""
    f, r = out["refusal"], out["retain"]
    js_f = js_to_onehot(token_logprobs(f["logits"], f["labels"]))
    js_r = js_divergence(r["logits"], out["ref_retain"]["logits"])
    loss_f = weighted_sum(js_f, f["labels"], f["weights"])
    loss_r = weighted_sum(js_r, r["labels"], r["weights"])
    return loss_f, loss_r, {"js_forget": loss_f.mean().detach(), "js_retain": loss_r.mean().detach()}


def jensunpp(out, hp):
    """JensUn++ (paper section 4, eqs. 1-3): JS to one-hot refusal targets on the prefix-mixed
    sequence (targets inside the answer prefix are the first refusal token), JS to the frozen model
    on retain, token weights w_1 = 1/2, w_t = 1/(2(|y|-1)) built by data.py. Balancing (eq. 4) is
    applied by train.py, which needs the logits' gradients."""
    f, r = out["mixed"], out["retain"]
    js_f = js_to_onehot(token_logprobs(f["logits"], f["labels"]))
    js_r = js_divergence(r["logits"], out["ref_retain"]["logits"])
    loss_f = weighted_sum(js_f, f["labels"], f["weights"])
    loss_r = weighted_sum(js_r, r["labels"], r["weights"])
    return loss_f, loss_r, {"js_forget": loss_f.mean().detach(), "js_retain": loss_r.mean().detach()}


def nll(out, hp):
    """Plain fine-tuning (relearning attacks, knowledge injection): NLL of the answers."""
    f = out["forget"]
    loss = sequence_nll(f["logits"], f["labels"], f["weights"])
    return loss, None, {"nll": loss.mean().detach()}


# ----------------------------------------------------------------------------------------------
# Method table: which sequence views each objective needs, and which need reference outputs.
#   forget views: "forget" = question + original answer, "refusal" = question + refusal,
#                 "mixed" = JensUn++ prefix-mixed sequence with refusal targets.
#   ref: views whose frozen-model outputs the loss reads ("logits", "seq_logprob" or "hidden").
#   weights: "uniform" (token mean) or "jensunpp" (w_1 = 1/2, rest share 1/2).
METHODS = {
    #  name        forget views             retain   ref outputs                                    weights      loss
    "ga":       dict(views=("forget",),            retain=False, ref={},                                            weights="uniform",  fn=ga),
    "graddiff": dict(views=("forget",),            retain=True,  ref={},                                            weights="uniform",  fn=graddiff),
    "dpo":      dict(views=("forget", "refusal"),  retain=True,  ref={"forget": "seq_logprob", "refusal": "seq_logprob"}, weights="uniform", fn=dpo),
    "npo":      dict(views=("forget",),            retain=True,  ref={"forget": "seq_logprob"},                     weights="uniform",  fn=npo),
    "simnpo":   dict(views=("forget",),            retain=True,  ref={},                                            weights="uniform",  fn=simnpo),
    "pdu":      dict(views=("forget",),            retain=True,  ref={},                                            weights="uniform",  fn=pdu),
    "rmu":      dict(views=("forget",),            retain=True,  ref={"retain": "hidden"},                          weights="uniform",  fn=rmu),
    "undial":   dict(views=("forget",),            retain=False, ref={"forget": "logits"},                          weights="uniform",  fn=undial),
    "wga":      dict(views=("forget",),            retain=True,  ref={},                                            weights="uniform",  fn=wga),
    "satimp":   dict(views=("forget",),            retain=True,  ref={},                                            weights="uniform",  fn=satimp),
    "jensun":   dict(views=("refusal",),           retain=True,  ref={"retain": "logits"},                          weights="uniform",  fn=jensun),
    "jensunpp": dict(views=("mixed",),             retain=True,  ref={"retain": "logits"},                          weights="jensunpp", fn=jensunpp),
    "nll":      dict(views=("forget",),            retain=False, ref={},                                            weights="uniform",  fn=nll),
}

# Paper defaults: the rows marked as selected in the appendix sweeps on Challenger (LR sweep, then the
# lambda sweep): tab:llama_hp_lr/tab:llama_hp_alpha, tab:challenger_ministral3b_lr/_alpha, tab:challenger_qwen3.5.
# Keys: (method, model family). "default" applies to families the paper did not tune (e.g. SmolLM2).
# Method constants not swept by the paper follow open-unlearning's configs, as the paper states (B.5).
METHOD_CONSTANTS = {
    "dpo": {"beta": 0.1},
    "npo": {"beta": 0.1},
    "simnpo": {"beta": 4.5, "delta": 0.0},
    "pdu": {"pdu_eta": 0.1, "pdu_eps_margin": 0.05, "pdu_warmup_epochs": 1},
    "rmu": {"rmu_layer": 7, "rmu_kappa": 2.0, "rmu_params": "mlp"},
    "undial": {"beta": 10.0},
    "wga": {"beta": 1.0},
    "satimp": {"beta1": 5.0, "beta2": 1.0},
}

HPARAMS = {
    ("graddiff", "llama"):     dict(lr=5e-7, lambda_f=1.0, lambda_r=2.0),
    ("jensun", "llama"):       dict(lr=5e-6, lambda_f=1.0, lambda_r=1.0),
    ("npo", "llama"):          dict(lr=8e-6, lambda_f=1.0, lambda_r=3.0),
    ("pdu", "llama"):          dict(lr=3e-6, lambda_f=1.0, lambda_r=1.0),
    ("rmu", "llama"):          dict(lr=3e-5, lambda_f=0.5, lambda_r=0.25),
    ("satimp", "llama"):       dict(lr=1e-5, lambda_f=0.1, lambda_r=1.0),
    ("simnpo", "llama"):       dict(lr=1e-5, lambda_f=0.125, lambda_r=0.5),
    ("undial", "llama"):       dict(lr=1e-4, lambda_f=1.0, lambda_r=0.0),
    ("wga", "llama"):          dict(lr=8e-6, lambda_f=1.0, lambda_r=1.0),
    ("jensunpp", "llama"):     dict(lr=3e-6, lambda_f=0.33, lambda_r=1.0),
    ("graddiff", "ministral"): dict(lr=3e-7, lambda_f=1.0, lambda_r=1.0),
    ("jensun", "ministral"):   dict(lr=1e-6, lambda_f=1.0, lambda_r=0.25),
    ("npo", "ministral"):      dict(lr=1e-6, lambda_f=1.0, lambda_r=1.0),
    ("pdu", "ministral"):      dict(lr=8e-7, lambda_f=1.0, lambda_r=0.25),
    ("jensunpp", "ministral"): dict(lr=1e-6, lambda_f=2.0, lambda_r=1.0),
    ("graddiff", "qwen"):      dict(lr=8e-7, lambda_f=1.0, lambda_r=1.0),
    ("jensun", "qwen"):        dict(lr=3e-6, lambda_f=1.0, lambda_r=0.5),
    ("npo", "qwen"):           dict(lr=5e-6, lambda_f=1.0, lambda_r=1.0),
    ("pdu", "qwen"):           dict(lr=3e-6, lambda_f=1.0, lambda_r=0.25),
    ("jensunpp", "qwen"):      dict(lr=2e-6, lambda_f=0.33, lambda_r=1.0),
    # Not in the paper's tables: DPO and GA (open-unlearning's defaults; GA at GradDiff's LR) and the
    # relearning loss (the paper's relearning learning rates).
    ("dpo", "llama"):          dict(lr=1e-5, lambda_f=1.0, lambda_r=1.0),
    ("ga", "llama"):           dict(lr=5e-7, lambda_f=1.0, lambda_r=0.0),
    ("nll", "llama"):          dict(lr=1e-5, lambda_f=1.0, lambda_r=0.0),   # relearning lr, tab:comb_4-topic_relearn_lr_1e-5_avg_llama3b
    ("nll", "ministral"):      dict(lr=2e-6, lambda_f=1.0, lambda_r=0.0),   # tab:comb_4-topic_relearn_lr_2e-6_avg_ministral3b
    ("nll", "qwen"):           dict(lr=5e-6, lambda_f=1.0, lambda_r=0.0),   # tab:comb_4-topic_relearn_lr_5e-6_avg_qwen3.5
}


def model_family(name):
    """Family key of HPARAMS for a model id or path ("llama", "ministral", "qwen"), else "default"."""
    low = name.lower()
    for key in ("ministral", "mistral", "qwen", "llama"):
        if key in low:
            return "ministral" if key == "mistral" else key
    return "default"


def resolve_hparams(method, family):
    """Paper hyperparameters for (method, family): the family's row, else the Llama row (the paper's
    tuning model), plus the method constants."""
    row = HPARAMS.get((method, family)) or HPARAMS[(method, "llama")]
    return {**row, **METHOD_CONSTANTS.get(method, {})}
