"""Every unlearning objective, one function each, plus the table of paper defaults.

Conventions (shapes in comments):
- `logits` are the model's next-token logits at supervised positions only, (B, K, V), upcast to fp32.
  train.py keeps the last K positions of each left-padded row, so position k of row b predicts
  `labels[b, k]`; -100 marks positions that are not supervised (padding, shorter answers).
  `own_logits` (B, K, V) are the logits AT the position of the token `labels[b, k]` (one to the right),
  and `hidden` (B, K, d) a hooked layer's output there (PDU's logit gap and RMU's activations are taken
  at the answer tokens' own positions, as in the authors' code).
- `weights` (B, K) are per-position weights (0 where labels are -100); for uniform methods each row's
  weights are 1 / (number of supervised tokens), so a weighted sum is a per-example token mean.
- Two reductions, chosen per loss term as the authors' code does: `batch_token_mean` (one mean over
  every supervised token of the micro-batch, the usual causal-LM loss: the baselines' NLL-type terms)
  and `example_mean` (each example's weighted token sum, then the mean over examples: JensUn++, the
  sequence-level NPO/DPO/SimNPO terms). Both return a (B,) vector whose mean is the micro-batch loss.
- A loss function receives `out`, a dict with the tensors its METHODS row asks for (views "forget",
  "refusal", "mixed", "cyclic", "full", "retain"; reference outputs under "ref_<view>"), and `hp`, the
  resolved hyperparameters. It returns (B,) forget and retain losses and a dict of detached 0-dim
  diagnostic tensors (train.py reads them once per optimizer step, so the GPU never waits mid-step).
  train.py combines the losses as lambda_f * L_f + lambda_r * L_r (JensUn++ adds alpha).

A new method is one function here plus one row in METHODS (and one in HPARAMS for its defaults).
Everything special about a method (its refusal, loss balancing, hidden-state hook, setup, dual
variable) is declared in its METHODS row; train.py has no per-method branches.
"""
import math

import torch
import torch.nn.functional as F

IGNORE = -100
LOG2 = math.log(2.0)
JS_CHUNK_POSITIONS = 512    # js_divergence: positions per checkpointed chunk (512 x 128k fp32 logits: 256 MiB)


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


def js_divergence(logits_p, logits_q, positions=None):
    """General JS(p || q) per position over the vocabulary, (B, K); natural log. Under autograd on a GPU it runs
    over rows of about `positions` (JS_CHUNK_POSITIONS) positions at a time, each chunk's vocabulary-sized
    intermediates made again in backward (activation checkpointing): the same values, one chunk's intermediates
    alive instead of about ten (B, K, V) tensors (for a 3B Llama's 128k vocabulary, gigabytes; issue 52). On a
    CPU, where memory is not what bounds a run and the recomputation costs time, in one piece."""
    positions = positions or (JS_CHUNK_POSITIONS if logits_p.is_cuda else 0)
    if not (positions and torch.is_grad_enabled() and logits_p.requires_grad):
        return _js_per_position(logits_p, logits_q)
    rows = max(1, positions // max(1, logits_p.shape[1]))
    return torch.cat([torch.utils.checkpoint.checkpoint(_js_per_position, logits_p[i:i + rows], logits_q[i:i + rows],
                                                        use_reentrant=False) for i in range(0, len(logits_p), rows)])


def _js_per_position(logits_p, logits_q):
    logp, logq = F.log_softmax(logits_p, -1), F.log_softmax(logits_q, -1)
    logm = torch.logaddexp(logp, logq) - LOG2
    kl_pm = (logp.exp() * (logp - logm)).sum(-1)
    kl_qm = (logq.exp() * (logq - logm)).sum(-1)
    return 0.5 * (kl_pm + kl_qm)


def example_mean(per_token, labels, weights):
    """Each example's weighted token sum, (B,): with uniform weights its own token mean, so the batch
    mean weighs every example equally (JensUn++ eqs. 1 and 3 with its weights w_t)."""
    return (per_token * weights * (labels != IGNORE)).sum(-1)


def batch_token_mean(per_token, labels):
    """One mean over every supervised token of the micro-batch (the usual causal-LM loss, as the
    authors' baselines reduce), as a (B,) vector whose mean is that value: example b contributes its
    token sum times B / (supervised tokens in the micro-batch). Long answers weigh more than short ones."""
    mask = labels != IGNORE
    return (per_token * mask).sum(-1) * mask.shape[0] / mask.sum().clamp(min=1)


def nll_tokens(view):
    """Token NLL of a view, (B, K); 0 at unsupervised positions."""
    return -token_logprobs(view["logits"], view["labels"])


def nll_retain(out, hp):
    """Retain NLL, one token mean over the micro-batch (GradDiff, NPO, SimNPO, PDU, WGA, SatImp, DPO)."""
    return batch_token_mean(nll_tokens(out["retain"]), out["retain"]["labels"])


# ----------------------------------------------------------------------------------------------
# Objectives

def ga(out, hp):
    """Gradient ascent (Jang et al. 2023): minimise minus the forget NLL (micro-batch token mean)."""
    f = out["forget"]
    nll = batch_token_mean(nll_tokens(f), f["labels"])
    loss_r = nll_retain(out, hp) if "retain" in out else None       # only with --lambda-r > 0
    return -nll, loss_r, {"forget_nll": nll.mean().detach()}


def graddiff(out, hp):
    """GradDiff (Liu et al. 2022; TOFU): -NLL(forget) + lambda_r * NLL(retain), both micro-batch token means."""
    f = out["forget"]
    nll_f = batch_token_mean(nll_tokens(f), f["labels"])
    nll_r = nll_retain(out, hp)
    return -nll_f, nll_r, {"forget_nll": nll_f.mean().detach(), "retain_nll": nll_r.mean().detach()}


def dpo(out, hp):
    """DPO for unlearning (ours: not among the paper's baselines): preferred = refusal, rejected =
    original answer, frozen reference.

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
    """PDU (Entesari et al. 2025): L_f = (max_v z_v - mean_v z_v)^2 at the answer tokens' own positions
    (first answer token .. end-of-turn), one token mean over the micro-batch as the authors' code takes
    it; retain NLL (micro-batch token mean).

    The constraint L_r <= eps enters as lambda_r (L_r - eps); lambda_r is a dual variable that
    pdu_dual_step updates after every micro-batch once the dual warm-up is over.
    """
    f = out["forget"]
    z = f["own_logits"]
    gap = (z.max(-1).values - z.mean(-1)) ** 2                             # (B, K)
    loss_f = batch_token_mean(gap, f["labels"])
    nll_r = nll_retain(out, hp)
    return loss_f, nll_r - hp["pdu_eps"], {"logit_gap": loss_f.mean().detach(), "retain_nll": nll_r.mean().detach()}


def pdu_dual_step(lambda_r, stats, hp, epoch):
    """Dual ascent on the retain constraint L_r <= eps, after every micro-batch from epoch
    `pdu_warmup_epochs` on: lambda_r <- max(0, lambda_r + eta (L_r - eps)). With the authors' eps = 0
    the constraint is never met, so lambda_r only grows. A device tensor: no host sync."""
    if epoch < hp["pdu_warmup_epochs"]:
        return lambda_r
    return (lambda_r + hp["pdu_eta"] * (stats["retain_nll"] - hp["pdu_eps"])).clamp(min=0)


def rmu(out, hp):
    """RMU (Li et al. 2024, WMDP): steer layer-l activations at the forget answer tokens' own positions
    to c = kappa u/|u|; keep retain activations equal to the frozen model's. Hidden states come from a
    hook (train.py). The authors' per-example reduction divides (B,) sums by (B, 1) counts, a broadcast
    that is exact only when all answers have the same length; we take per-example means."""
    f, r = out["forget"], out["retain"]
    control = hp["control_vector"].to(f["hidden"])                          # (d,), its dtype and device
    mask_f = f["labels"] != IGNORE
    mask_r = r["labels"] != IGNORE
    se_f = ((f["hidden"] - control) ** 2).mean(-1)                          # (B, K)
    se_r = ((r["hidden"] - out["ref_retain"]["hidden"]) ** 2).mean(-1)
    loss_f = (se_f * mask_f).sum(-1) / mask_f.sum(-1).clamp(min=1)
    loss_r = (se_r * mask_r).sum(-1) / mask_r.sum(-1).clamp(min=1)
    return loss_f, loss_r, {"forget_mse": loss_f.mean().detach(), "retain_mse": loss_r.mean().detach()}


def rmu_setup(model, hp, seed):
    """The control vector c = kappa u/|u|, u ~ U[0,1)^d from a seeded generator (RMU trains all
    parameters, as the authors' runs do)."""
    u = torch.rand(model.config.hidden_size, generator=torch.Generator().manual_seed(seed))
    hp["control_vector"] = hp["rmu_kappa"] * u / u.norm()


def undial(out, hp):
    """UNDIAL (Dong et al. 2025): self-distillation towards the frozen model's distribution with the
    true token's teacher logit lowered by beta at the answer positions only; L_f = CE(softmax(teacher),
    p_theta) averaged over EVERY real position of the micro-batch (prompt, in-context turns and answer:
    elsewhere it distils the frozen model unchanged, an implicit anchor), as the authors' code does.
    Their code also averaged padding positions and, because of the -100 labels, lowered the logit of
    token V-100 there (the index wraps): a bug we do not copy."""
    f = out["full"]
    teacher = out["ref_full"]["logits"].clone()                              # (B, K, V)
    safe = f["labels"].clamp(min=0).unsqueeze(-1)
    lowered = teacher.gather(-1, safe) - hp["beta"] * f["answer_mask"].unsqueeze(-1)
    teacher.scatter_(-1, safe, lowered)
    q = F.softmax(teacher, -1)
    ce = -(q * F.log_softmax(f["logits"], -1)).sum(-1)                       # (B, K)
    loss_f = batch_token_mean(ce, f["labels"])
    loss_r = nll_retain(out, hp) if "retain" in out else None       # only with --lambda-r > 0
    return loss_f, loss_r, {"distill_ce": loss_f.mean().detach()}


def _weighted_ascent(out, hp, token_weight):
    f = out["forget"]
    logp = token_logprobs(f["logits"], f["labels"])                         # (B, K)
    w = token_weight(logp.detach().exp())
    loss_f = batch_token_mean(w * logp, f["labels"])                         # = -token mean of w * NLL
    nll_r = nll_retain(out, hp)
    return loss_f, nll_r, {"forget_logp": batch_token_mean(logp, f["labels"]).mean().detach(),
                           "retain_nll": nll_r.mean().detach()}


def wga(out, hp):
    """WGA (Wang et al. 2025): weighted gradient ascent, w_t = p_t^beta (detached); + retain NLL."""
    return _weighted_ascent(out, hp, lambda p: p ** hp["beta"])


def satimp(out, hp):
    """SatImp (Yang et al. 2025): w_t = p_t^beta1 (1 - p_t)^beta2 (detached); otherwise as WGA."""
    return _weighted_ascent(out, hp, lambda p: p ** hp["beta1"] * (1 - p) ** hp["beta2"])


def jensun(out, hp):
    """JensUn (Singh et al. 2025), as the authors ran it: the input is question + ORIGINAL answer, and
    the targets at every answer and end-of-turn position are the refusal "No Idea" repeated cyclically
    (view "cyclic"): JS(p_theta || one-hot) there; JS(p_theta || p_ref) on retain answers; each one token
    mean over the micro-batch, as the authors' code takes them."""
    f, r = out["cyclic"], out["retain"]
    js_f = js_to_onehot(token_logprobs(f["logits"], f["labels"]))
    js_r = js_divergence(r["logits"], out["ref_retain"]["logits"])
    loss_f = batch_token_mean(js_f, f["labels"])
    loss_r = batch_token_mean(js_r, r["labels"])
    return loss_f, loss_r, {"js_forget": loss_f.mean().detach(), "js_retain": loss_r.mean().detach()}


def jensunpp(out, hp):
    """JensUn++ (paper section 4, eqs. 1-3): JS to one-hot refusal targets on the prefix-mixed
    sequence (targets inside the answer prefix are the first refusal token), JS to the frozen model
    on retain, token weights w_1 = 1/2, w_t = 1/(2(|y|-1)) built by data.py. Balancing (eq. 4) is
    applied by train.py, which needs the logits' gradients."""
    f, r = out["mixed"], out["retain"]
    js_f = js_to_onehot(token_logprobs(f["logits"], f["labels"]))
    js_r = js_divergence(r["logits"], out["ref_retain"]["logits"])
    loss_f = example_mean(js_f, f["labels"], f["weights"])
    loss_r = example_mean(js_r, r["labels"], r["weights"])
    return loss_f, loss_r, {"js_forget": loss_f.mean().detach(), "js_retain": loss_r.mean().detach()}


def nll(out, hp):
    """Plain fine-tuning (relearning attacks, knowledge injection): NLL of the answers, micro-batch token mean."""
    f = out["forget"]
    loss = batch_token_mean(nll_tokens(f), f["labels"])
    return loss, None, {"nll": loss.mean().detach()}


# ----------------------------------------------------------------------------------------------
# Method table. Columns:
#   views: the forget-side sequences the loss reads (data.PairedTrainSet.views):
#     "forget" = question + original answer; "refusal" = question + refusal; "mixed" = JensUn++ prefix-mixed
#     sequence with refusal targets (eq. 2); "cyclic" = question + original answer with "No Idea" targets
#     repeated cyclically (JensUn); "full" = question + answer with every next token of the whole sequence
#     supervised and the answer span marked (UNDIAL).
#   retain: whether the retain view is always needed (else only with --lambda-r > 0).
#   ref: views whose frozen-model outputs the loss reads ("logits", "seq_logprob" or "hidden").
#   weights: per-token weights of `example_mean`: "uniform" (1/n) or "jensunpp" (w_1 = 1/2, eq. 9).
# Optional, for what a method needs beyond its loss:
#   refusal: "model" (resolved from --refusal: the model's own refusal, "Unfortunately, " first) or a fixed string;
#   context_refusals: the retain in-context pool also holds the topic's 25 direct forget questions answered
#     with the refusal (appendix B.3); balance: dynamic loss balancing, eq. 4 (--no-balance turns it off);
#   hidden: the hp key naming the decoder layer whose output a hook captures ("hidden" in the views);
#   setup(model, hp, seed): run once per stage before training; dual(lambda_r, stats, hp, epoch): the
#     retain factor as a dual variable, updated after every micro-batch; relearn: fine-tuning (relearning
#     attacks, knowledge injection), trained on --relearn-set without retain pairs.
METHODS = {
    #  name        forget views             retain        ref outputs                                    weights      loss
    "ga":       dict(views=("forget",),            retain=False, ref={},                                            weights="uniform",  fn=ga),
    "graddiff": dict(views=("forget",),            retain=True,  ref={},                                            weights="uniform",  fn=graddiff),
    "dpo":      dict(views=("forget", "refusal"),  retain=True,  ref={"forget": "seq_logprob", "refusal": "seq_logprob"}, weights="uniform", fn=dpo,
                     refusal="model"),
    "npo":      dict(views=("forget",),            retain=True,  ref={"forget": "seq_logprob"},                     weights="uniform",  fn=npo),
    "simnpo":   dict(views=("forget",),            retain=True,  ref={},                                            weights="uniform",  fn=simnpo),
    "pdu":      dict(views=("forget",),            retain=True,  ref={},                                            weights="uniform",  fn=pdu,
                     dual=pdu_dual_step),
    "rmu":      dict(views=("forget",),            retain=True,  ref={"retain": "hidden"},                          weights="uniform",  fn=rmu,
                     hidden="rmu_layer", setup=rmu_setup),
    "undial":   dict(views=("full",),              retain=False, ref={"full": "logits"},                            weights="uniform",  fn=undial),
    "wga":      dict(views=("forget",),            retain=True,  ref={},                                            weights="uniform",  fn=wga),
    "satimp":   dict(views=("forget",),            retain=True,  ref={},                                            weights="uniform",  fn=satimp),
    "jensun":   dict(views=("cyclic",),            retain=True,  ref={"retain": "logits"},                          weights="uniform",  fn=jensun,
                     refusal="No Idea"),
    "jensunpp": dict(views=("mixed",),             retain=True,  ref={"retain": "logits"},                          weights="jensunpp", fn=jensunpp,
                     refusal="model", context_refusals=True, balance=True),
    "nll":      dict(views=("forget",),            retain=False, ref={},                                            weights="uniform",  fn=nll,
                     relearn=True),
}

# Paper defaults: the rows marked as selected in the appendix sweeps on Challenger (LR sweep, then the
# lambda sweep): tab:llama_hp_lr/tab:llama_hp_alpha, tab:challenger_ministral3b_lr/_alpha, tab:challenger_qwen3.5.
# Keys: (method, model family); the family is read from the model's config (model.model_family: "llama",
# "ministral", "qwen", else "default"). Families without a row, "default" among them, take the Llama row.
# Method constants not swept by the paper are the authors' (open-unlearning's configs, as the paper states in
# B.5); PDU's are the values the authors' runs used: eps 0, dual step 1.0, 5 warm-up epochs.
METHOD_CONSTANTS = {
    "dpo": {"beta": 0.1},
    "npo": {"beta": 0.1},
    "simnpo": {"beta": 4.5, "delta": 0.0},
    "pdu": {"pdu_eta": 1.0, "pdu_eps": 0.0, "pdu_warmup_epochs": 5},
    "rmu": {"rmu_layer": 7, "rmu_kappa": 2.0},
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


# The LKF* recipe (train.py --recipe lkf; appendix tab:challenger_hparam_utility_llama3b, its selected rows,
# Llama): 10 epochs on the LKF* root with random forget/retain pairs (LKF* has no pairing). A method without
# a row here takes its SUITE row.
LKF_EPOCHS = 10
LKF_HPARAMS = {
    ("graddiff", "llama"): dict(lr=5e-6, lambda_f=0.5, lambda_r=0.5),
    ("jensun", "llama"):   dict(lr=3e-6, lambda_f=1.0, lambda_r=0.5),
    ("npo", "llama"):      dict(lr=9e-6, lambda_f=1.0, lambda_r=1.0),
    ("pdu", "llama"):      dict(lr=5e-6, lambda_f=1.0, lambda_r=1.0),
    ("rmu", "llama"):      dict(lr=3e-5, lambda_f=0.5, lambda_r=1.0),
    ("jensunpp", "llama"): dict(lr=5e-6, lambda_f=0.33, lambda_r=1.0),
}


def resolve_hparams(method, family, recipe="suite"):
    """Paper hyperparameters for (method, family): the family's row, else the Llama row (the paper's
    tuning model), plus the method constants. recipe "lkf": the LKF* table's row where it has one."""
    row = (recipe == "lkf" and (LKF_HPARAMS.get((method, family)) or LKF_HPARAMS.get((method, "llama"))))
    row = row or HPARAMS.get((method, family)) or HPARAMS[(method, "llama")]
    return {**row, **METHOD_CONSTANTS.get(method, {})}
