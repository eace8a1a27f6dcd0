"""Each objective against values computed by hand on tiny tensors, plus known properties.

    python -m pytest tests/test_losses.py -q
"""
import math
import random

import pytest
import torch
import torch.nn.functional as F

import data
import losses
import train

IGN = losses.IGNORE


def view(logits, labels, scheme="uniform", own_logits=None):
    labels = torch.tensor(labels)
    weights = torch.zeros(labels.shape)
    for b in range(labels.shape[0]):
        m = int((labels[b] != IGN).sum())
        weights[b, labels.shape[1] - m:] = torch.tensor(data.token_weights(m, scheme))
    logits = torch.tensor(logits, dtype=torch.float32)
    own = logits if own_logits is None else torch.tensor(own_logits, dtype=torch.float32)
    return {"logits": logits, "own_logits": own, "labels": labels, "weights": weights,
            "answer_mask": (labels != IGN).float()}


# Two positions over a 3-token vocabulary; the answer is token 0 then token 2.
LOGITS = [[[2.0, 0.0, 0.0], [0.0, 1.0, 3.0]]]
LABELS = [[0, 2]]


def logp(row, tok):
    return row[tok] - math.log(sum(math.exp(z) for z in row))


LP0, LP1 = logp(LOGITS[0][0], 0), logp(LOGITS[0][1], 2)


def test_token_logprobs_and_nll_by_hand():
    v = view(LOGITS, LABELS)
    assert torch.allclose(losses.token_logprobs(v["logits"], v["labels"]), torch.tensor([[LP0, LP1]]))
    assert losses.sequence_nll(v["logits"], v["labels"], v["weights"]).item() == pytest.approx(-(LP0 + LP1) / 2)
    masked = view(LOGITS, [[IGN, 2]])
    assert losses.sequence_nll(masked["logits"], masked["labels"], masked["weights"]).item() == pytest.approx(-LP1)


def test_ga_and_graddiff():
    out = {"forget": view(LOGITS, LABELS)}
    f, r, _ = losses.ga(out, {})
    assert f.item() == pytest.approx((LP0 + LP1) / 2) and r is None
    out["retain"] = view(LOGITS, [[IGN, 2]])
    f, r, _ = losses.graddiff(out, {})
    assert f.item() == pytest.approx((LP0 + LP1) / 2) and r.item() == pytest.approx(-LP1)


# Two examples: a one-token answer (token 0 at the first row's second position) and the two-token one.
BATCH_LOGITS = [[[0.0, 0.0, 0.0], [2.0, 0.0, 0.0]], LOGITS[0]]
BATCH_LABELS = [[IGN, 0], [0, 2]]
LPA = logp(BATCH_LOGITS[0][1], 0)


def test_baselines_take_one_token_mean_over_the_micro_batch():
    """The authors' baselines reduce like the causal-LM loss: one mean over the 3 supervised tokens of
    the batch, not the mean of the two examples' means (which JensUn++ uses)."""
    token_mean = -(LPA + LP0 + LP1) / 3
    example_mean = -(LPA + (LP0 + LP1) / 2) / 2
    assert token_mean != pytest.approx(example_mean)
    out = {"forget": view(BATCH_LOGITS, BATCH_LABELS), "retain": view(BATCH_LOGITS, BATCH_LABELS)}
    f, r, _ = losses.graddiff(out, {})
    assert f.mean().item() == pytest.approx(-token_mean) and r.mean().item() == pytest.approx(token_mean)
    for fn, hp in ((losses.npo, {"beta": 0.1}), (losses.simnpo, {"beta": 4.5, "delta": 0.0}),
                   (losses.wga, {"beta": 1.0}), (losses.pdu, {"pdu_eps": 0.0})):
        out["ref_forget"] = {"seq_logprob": torch.zeros(2)}
        _, r, _ = fn(out, hp)
        assert r.mean().item() == pytest.approx(token_mean), fn.__name__
    out["ref_retain"] = {"logits": torch.tensor(BATCH_LOGITS)}
    out["cyclic"] = view(BATCH_LOGITS, BATCH_LABELS)
    js = lambda lp: math.log(2) + 0.5 * (math.exp(lp) * lp - (1 + math.exp(lp)) * math.log1p(math.exp(lp)))
    f, _, _ = losses.jensun(out, {})               # the forget JS too (the authors' code; not a mean of means)
    assert f.mean().item() == pytest.approx((js(LPA) + js(LP0) + js(LP1)) / 3, rel=1e-5)
    own = [[[0.0, 0.0, 0.0], [0.0, 6.0, 0.0]], [[0.0, 3.0, 0.0], [0.0, 0.0, 9.0]]]
    out["forget"] = view(BATCH_LOGITS, BATCH_LABELS, own_logits=own)
    f, _, _ = losses.pdu(out, {"pdu_eps": 0.0})    # and PDU's logit gap: squared gaps 16, 4 and 36
    assert f.mean().item() == pytest.approx((16 + 4 + 36) / 3, rel=1e-6)
    f, _, _ = losses.nll({"forget": view(BATCH_LOGITS, BATCH_LABELS)}, {})
    assert f.mean().item() == pytest.approx(token_mean)
    # WGA's forget term: the token mean of p_t * log p_t
    f, _, _ = losses.wga(out, {"beta": 1.0})
    expected = sum(math.exp(lp) * lp for lp in (LPA, LP0, LP1)) / 3
    assert f.mean().item() == pytest.approx(expected, rel=1e-6)
    # JensUn++ keeps per-example weighted sums: example 1 has one token (weight 1), example 2 w = (1/2, 1/2)
    js = lambda lp: math.log(2) + 0.5 * (math.exp(lp) * lp - (1 + math.exp(lp)) * math.log1p(math.exp(lp)))
    out = {"mixed": view(BATCH_LOGITS, BATCH_LABELS, "jensunpp"), "retain": view(BATCH_LOGITS, BATCH_LABELS, "jensunpp"),
           "ref_retain": {"logits": torch.tensor(BATCH_LOGITS)}}
    f, _, _ = losses.jensunpp(out, {})
    assert f.mean().item() == pytest.approx((js(LPA) + 0.5 * js(LP0) + 0.5 * js(LP1)) / 2, rel=1e-5)


def test_npo_by_hand():
    out = {"forget": view(LOGITS, LABELS), "ref_forget": {"seq_logprob": torch.tensor([-1.0])},
           "retain": view(LOGITS, LABELS)}
    beta = 0.1
    s = LP0 + LP1
    expected = -(2 / beta) * math.log(1 / (1 + math.exp(beta * (s + 1.0))))   # log sigmoid(-beta (s - s_ref))
    f, _, _ = losses.npo(out, {"beta": beta})
    assert f.item() == pytest.approx(expected, rel=1e-5)
    # at S_theta = S_ref the loss is (2/beta) log 2 and its gradient pushes S_theta down
    out["ref_forget"]["seq_logprob"] = torch.tensor([s])
    f, _, _ = losses.npo(out, {"beta": beta})
    assert f.item() == pytest.approx(2 / beta * math.log(2), rel=1e-5)


def test_dpo_by_hand():
    refusal = [[[0.0, 4.0, 0.0], [1.0, 0.0, 0.0]]]
    out = {"forget": view(LOGITS, LABELS), "refusal": view(refusal, [[1, 0]]), "retain": view(LOGITS, LABELS),
           "ref_forget": {"seq_logprob": torch.tensor([-2.0])}, "ref_refusal": {"seq_logprob": torch.tensor([-3.0])}}
    beta = 0.1
    s_win = logp(refusal[0][0], 1) + logp(refusal[0][1], 0)
    margin = (s_win + 3.0) - (LP0 + LP1 + 2.0)
    expected = -(2 / beta) * math.log(1 / (1 + math.exp(-beta * margin)))
    f, _, stats = losses.dpo(out, {"beta": beta})
    assert f.item() == pytest.approx(expected, rel=1e-5)
    assert float(stats["margin"]) == pytest.approx(margin, rel=1e-5)


def test_simnpo_by_hand():
    out = {"forget": view(LOGITS, LABELS), "retain": view(LOGITS, LABELS)}
    beta, delta = 4.5, 0.0
    mean_nll = -(LP0 + LP1) / 2
    expected = -(2 / beta) * math.log(1 / (1 + math.exp(-beta * (mean_nll - delta))))
    f, _, _ = losses.simnpo(out, {"beta": beta, "delta": delta})
    assert f.item() == pytest.approx(expected, rel=1e-5)


def test_pdu_by_hand():
    """The logit gap is taken at the answer tokens' own positions (own_logits), not at the positions
    that predict them."""
    own = [[[0.0, 5.0, 2.0], [1.0, 1.0, 4.0]]]
    out = {"forget": view(LOGITS, LABELS, own_logits=own), "retain": view(LOGITS, LABELS)}
    gaps = [(5.0 - 7.0 / 3) ** 2, (4.0 - 2.0) ** 2]
    f, r, _ = losses.pdu(out, {"pdu_eps": 0.5})
    assert f.item() == pytest.approx(sum(gaps) / 2, rel=1e-6)
    assert r.item() == pytest.approx(-(LP0 + LP1) / 2 - 0.5, rel=1e-6)


def test_pdu_dual_variable():
    """lambda_r <- max(0, lambda_r + eta (L_r - eps)) after every micro-batch once the warm-up epochs
    are over; with the authors' eps = 0 it only grows."""
    hp = {**losses.METHOD_CONSTANTS["pdu"]}
    assert (hp["pdu_eta"], hp["pdu_eps"], hp["pdu_warmup_epochs"]) == (1.0, 0.0, 5)
    lam = torch.tensor(1.0)
    stats = {"retain_nll": torch.tensor(0.25)}
    assert losses.pdu_dual_step(lam, stats, hp, epoch=4).item() == 1.0
    assert losses.pdu_dual_step(lam, stats, hp, epoch=5).item() == pytest.approx(1.25)
    assert losses.pdu_dual_step(torch.tensor(0.1), stats, {**hp, "pdu_eps": 1.0}, epoch=9).item() == 0.0


def test_wga_and_satimp_weights_by_hand():
    out = {"forget": view(LOGITS, LABELS), "retain": view(LOGITS, LABELS)}
    p0, p1 = math.exp(LP0), math.exp(LP1)
    f, _, _ = losses.wga(out, {"beta": 1.0})
    assert f.item() == pytest.approx((p0 * LP0 + p1 * LP1) / 2, rel=1e-6)
    f, _, _ = losses.satimp(out, {"beta1": 5.0, "beta2": 1.0})
    w0, w1 = p0 ** 5 * (1 - p0), p1 ** 5 * (1 - p1)
    assert f.item() == pytest.approx((w0 * LP0 + w1 * LP1) / 2, rel=1e-6)
    # the weights are detached: the gradient equals the weighted NLL gradient
    v = view(LOGITS, LABELS)
    v["logits"].requires_grad_(True)
    f, _, _ = losses.wga({"forget": v, "retain": view(LOGITS, LABELS)}, {"beta": 1.0})
    f.backward()
    g = v["logits"].grad[0, 0]
    probs = F.softmax(torch.tensor(LOGITS[0][0]), -1)
    assert torch.allclose(g, p0 * (torch.tensor([1.0, 0, 0]) - probs) / 2, atol=1e-6)


def test_undial_by_hand():
    """Soft-label CE at every real position (a prompt position too), the teacher's true-token logit
    lowered by beta at the answer position only; the padding position is left out."""
    logits = [[[0.0, 0.0, 0.0], [2.0, 0.0, 0.0], [0.0, 1.0, 3.0]]]
    ref = torch.tensor([[[9.0, 9.0, 9.0], [1.0, 0.0, 0.0], [0.0, 0.0, 2.0]]])
    f_view = view(logits, [[IGN, 1, 2]])
    f_view["answer_mask"] = torch.tensor([[0.0, 0.0, 1.0]])           # position 1 is a prompt position
    beta = 10.0
    teacher = ref.clone()
    teacher[0, 2, 2] -= beta
    ce = -(F.softmax(teacher, -1) * F.log_softmax(torch.tensor(logits), -1)).sum(-1)     # (1, 3)
    f, r, _ = losses.undial({"full": f_view, "ref_full": {"logits": ref}}, {"beta": beta})
    assert f.item() == pytest.approx((ce[0, 1] + ce[0, 2]).item() / 2, rel=1e-6) and r is None


def test_rmu_by_hand():
    hidden_f = torch.tensor([[[1.0, 0.0], [0.0, 1.0]]])
    hidden_r = torch.tensor([[[2.0, 2.0], [1.0, 1.0]]])
    out = {"forget": {**view(LOGITS, LABELS), "hidden": hidden_f},
           "retain": {**view(LOGITS, [[IGN, 2]]), "hidden": hidden_r},
           "ref_retain": {"hidden": torch.tensor([[[0.0, 0.0], [1.0, 0.0]]])}}
    c = torch.tensor([3.0, 4.0])
    f, r, _ = losses.rmu(out, {"control_vector": c})
    assert f.item() == pytest.approx((((1 - 3) ** 2 + 16) / 2 + (9 + 9) / 2) / 2)
    assert r.item() == pytest.approx((0 + 1) / 2)          # only the supervised second position counts


def test_js_onehot_closed_form_equals_general_js():
    torch.manual_seed(0)
    logits = torch.randn(3, 4, 11) * 3
    target = torch.randint(0, 11, (3, 4))
    onehot_logits = torch.full_like(logits, -1e4).scatter(-1, target.unsqueeze(-1), 0.0)
    general = losses.js_divergence(logits, onehot_logits)
    closed = losses.js_to_onehot(losses.token_logprobs(logits, target))
    assert torch.allclose(general, closed, atol=1e-5)
    # bounds: 0 when p_y = 1, log 2 when p_y = 0
    assert losses.js_to_onehot(torch.tensor(0.0)).item() == pytest.approx(0.0, abs=1e-7)
    assert losses.js_to_onehot(torch.tensor(-1e4)).item() == pytest.approx(math.log(2))


def test_js_in_checkpointed_chunks_gives_the_same_values_and_gradients():
    """Under autograd js_divergence runs in chunks of rows whose intermediates backward makes again: the values
    equal the one-piece computation exactly, the gradients to fp32 rounding, whatever the chunk (one row, a
    size that does not divide the rows, all rows); without autograd, or on a CPU by default, in one piece."""
    torch.manual_seed(0)
    q = torch.randn(7, 9, 50) * 2
    whole_p = (torch.randn(7, 9, 50) * 2).requires_grad_()
    whole = losses._js_per_position(whole_p, q)
    (whole * torch.linspace(0, 1, 9)).sum().backward()
    for positions in (1, 20, 10_000):
        p = whole_p.detach().clone().requires_grad_()
        js = losses.js_divergence(p, q, positions=positions)
        (js * torch.linspace(0, 1, 9)).sum().backward()
        assert torch.equal(js, whole) and torch.allclose(p.grad, whole_p.grad, rtol=1e-6, atol=1e-8)
    with torch.no_grad():
        assert torch.equal(losses.js_divergence(whole_p, q, positions=1), whole)
    assert losses.js_divergence(whole_p, q).grad_fn.name() != "CatBackward0"       # CPU default: one piece


def test_jensun_and_jensunpp_by_hand():
    # retain: identical policy and reference -> 0; forget: JS to one-hot at each target, weighted
    out = {"mixed": view(LOGITS, LABELS, "jensunpp"), "refusal": view(LOGITS, LABELS),
           "retain": view(LOGITS, LABELS, "jensunpp"), "ref_retain": {"logits": torch.tensor(LOGITS)}}
    js = [math.log(2) + 0.5 * (math.exp(l) * l - (1 + math.exp(l)) * math.log1p(math.exp(l))) for l in (LP0, LP1)]
    f, r, _ = losses.jensunpp(out, {})
    assert f.item() == pytest.approx(0.5 * js[0] + 0.5 * js[1], rel=1e-5) and r.item() == pytest.approx(0, abs=1e-7)
    out["cyclic"] = view(LOGITS, LABELS)
    f, r, _ = losses.jensun(out, {})
    assert f.item() == pytest.approx((js[0] + js[1]) / 2, rel=1e-5)


def test_token_weights_sum_to_one():
    for n in range(1, 30):
        for scheme in ("uniform", "jensunpp"):
            w = data.token_weights(n, scheme)
            assert len(w) == n and sum(w) == pytest.approx(1.0)
    assert data.token_weights(5, "jensunpp") == [0.5, 0.125, 0.125, 0.125, 0.125]


def test_prefix_sampler_matches_pi():
    """Chi-square test of 40k draws against pi(0) = 1/2, pi(i) = (1/2)(1/i)/H_n (eq. 8)."""
    n, draws = 6, 40000
    rng = random.Random(123)
    counts = [0] * (n + 1)
    for _ in range(draws):
        counts[data.sample_prefix_length(n, rng)] += 1
    harmonic = sum(1 / k for k in range(1, n + 1))
    expected = [0.5 * draws] + [0.5 * draws * (1 / i) / harmonic for i in range(1, n + 1)]
    chi2 = sum((c - e) ** 2 / e for c, e in zip(counts, expected))
    assert chi2 < 22.46            # chi-square, 6 degrees of freedom, p = 0.001
    assert data.sample_prefix_length(0, rng) == 0


def test_mixed_sequence_targets():
    """Refusal at the reply start (20, 21, eot 99) and after a prefix with a leading space (30, 21, 99):
    right after the prompt the target is the reply-start token 20, at the other prefix positions the
    spaced first token 30, then the continuation's own tokens."""
    prompt, answer, refusal, spaced = [1, 2], [10, 11, 12], [20, 21, 99], [30, 21, 99]
    s = data.mixed_sequence(prompt, answer, refusal, spaced, 2)
    assert s["ids"] == [1, 2, 10, 11, 30, 21, 99]
    assert s["targets"] == [20, 30, 30, 21, 99]
    s1 = data.mixed_sequence(prompt, answer, refusal, spaced, 1)
    assert s1["ids"] == [1, 2, 10, 30, 21, 99] and s1["targets"] == [20, 30, 21, 99]
    s0 = data.mixed_sequence(prompt, answer, refusal, spaced, 0)
    assert s0["ids"] == [1, 2, 20, 21, 99] and s0["targets"] == refusal


def test_cyclic_and_full_sequences():
    """JensUn: the original answer as input, "No Idea" repeated cyclically as targets; UNDIAL: every next
    token supervised, the answer span marked, padding masked by collate."""
    s = data.cyclic_refusal_sequence([1, 2], [10, 11, 12, 99], [7, 8])
    assert s == {"ids": [1, 2, 10, 11, 12, 99], "targets": [7, 8, 7, 8]}
    f = data.full_sequence([1, 2, 3], [10, 99])
    assert f["ids"] == [1, 2, 3, 10, 99] and f["targets"] == [2, 3, 10, 99] and f["answer_len"] == 2
    batch = data.collate([f, data.full_sequence([4], [11, 99])], pad_id=0)
    assert batch["labels"].tolist() == [[2, 3, 10, 99], [IGN, IGN, 11, 99]]
    assert batch["answer_mask"].tolist() == [[0, 0, 1, 1], [0, 0, 1, 1]]
    assert batch["input_ids"].shape == (2, 5)


def test_balance_alpha_is_ratio_of_logit_gradient_norms():
    """Eq. 4 per loss micro-batch: two micro-batches share the logits (rows 0, 2 and rows 1, 3), and
    each alpha is the ratio of its own losses' gradient norms; 1 where a loss is below eps. (Each loss positive
    whatever the draw: a retain loss below eps would take the rule for small losses.)"""
    torch.manual_seed(0)
    logits = torch.randn(4, 3, 7, requires_grad=True)
    L_f = torch.stack([(logits[0] ** 2).sum() * 0.1, (logits[1] ** 2).sum() * 0.1])
    L_r = torch.stack([(logits[2] * 3).sum().abs(), (logits[3] * 5).sum().abs()])
    expected = [torch.full((3, 7), c).norm() / (0.2 * logits[row].detach().norm() + 1e-5) for c, row in ((3.0, 0), (5.0, 1))]
    alpha = train.balance_alpha(L_f, L_r, logits, torch.tensor([0, 1, 0, 1]))
    assert alpha.tolist() == pytest.approx([e.item() for e in expected], rel=1e-5)
    tiny = torch.tensor(1e-6, requires_grad=True)
    L_f = torch.stack([tiny * 1.0, (logits[1] ** 2).sum() * 0.1])
    alpha = train.balance_alpha(L_f, L_r, logits, torch.tensor([0, 1, 0, 1]))
    assert alpha[0].item() == 1.0 and alpha[1].item() == pytest.approx(expected[1].item(), rel=1e-5)   # below 1e-5


def test_hyperparameters_per_family():
    """The family's row (tab:llama_hp_lr ... tab:challenger_qwen3.5), the Llama row for a family without
    one ("default", and e.g. SatImp on Qwen), plus the method constants."""
    assert losses.resolve_hparams("jensunpp", "llama") == {"lr": 3e-6, "lambda_f": 0.33, "lambda_r": 1.0}
    assert losses.resolve_hparams("jensunpp", "ministral") == {"lr": 1e-6, "lambda_f": 2.0, "lambda_r": 1.0}
    assert losses.resolve_hparams("jensunpp", "qwen") == {"lr": 2e-6, "lambda_f": 0.33, "lambda_r": 1.0}
    assert losses.resolve_hparams("npo", "qwen") == {"lr": 5e-6, "lambda_f": 1.0, "lambda_r": 1.0, "beta": 0.1}
    assert losses.resolve_hparams("graddiff", "default") == losses.resolve_hparams("graddiff", "llama") \
        == {"lr": 5e-7, "lambda_f": 1.0, "lambda_r": 2.0}
    assert losses.resolve_hparams("satimp", "qwen") == losses.resolve_hparams("satimp", "llama")
    assert losses.resolve_hparams("nll", "default")["lr"] == 1e-5 and losses.resolve_hparams("nll", "qwen")["lr"] == 5e-6
