"""Train tiny-vqa's vision tower + projector on easy-vqa (train split), SmolLM2 frozen.

GPU run (what produced weights/tiny-vqa; see its README.md for the exact command):
    PYTHONPATH=src python scripts/train_tiny_vqa.py --gguf SmolLM2-135M-Instruct.Q4_1.gguf \
        --out OUTDIR --epochs 30 --batch 256 --seed 0 --time-budget 400 --time-limit 440
CPU smoke test on a tiny subset:
    PYTHONPATH=src python scripts/train_tiny_vqa.py --out /tmp/tvqa --device cpu \
        --max-questions 64 --max-val 32 --batch 8 --epochs 1 --val-images 20

Loss: cross-entropy on the answer tokens and the closing <|im_end|> only.  Accuracy here
is teacher-forced exact match of all answer tokens (the same as greedy decoding's answer).
Training questions are rewritten with a TRAIN_PARAPHRASES variant with probability
--paraphrase-prob, and their first letter is upper-cased with probability --capitalize-prob
(generic case augmentation); EVAL_PARAPHRASES are never used for training.

Auxiliary loss (--aux-weight): linear shape (3) and colour (8) heads on the mean of the
vision tower's last-layer patch tokens (the tokens the projector reads).  The labels come
from the training questions' answers (e.g. "what shape ..." -> shape; "is there a red
shape?" yes/no narrows the colour); images whose label is not determined get none.  The
heads are discarded: the saved weights are the LLaVA tower + projector only.

--time-budget: after the first epoch, the number of epochs is cut to what fits in this
many seconds (the cosine schedule is then laid over that many epochs; warm-up covers the
first epoch, so the schedule's shape is unaffected).  --time-limit is a hard stop.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from vlmcache.models import tiny_vqa as T
from vlmcache.models.paraphrases import (
    COLORS,
    EVAL_PARAPHRASES,  # noqa: F401  (never used for training)
    SHAPES,
    TRAIN_PARAPHRASES,
    paraphrase,
    parse_question,
)


def log(msg, fh=None):
    print(msg, flush=True)
    if fh:
        fh.write(msg + "\n")
        fh.flush()


def load_split(split: str):
    import easy_vqa
    from PIL import Image

    if split == "train":
        qs, ans, ids = easy_vqa.get_train_questions()
        paths = easy_vqa.get_train_image_paths()
    else:
        qs, ans, ids = easy_vqa.get_test_questions()
        paths = easy_vqa.get_test_image_paths()
    order = sorted(paths)
    index = {i: k for k, i in enumerate(order)}
    images = T.preprocess_images([Image.open(paths[i]) for i in order])
    return list(qs), list(ans), [index[i] for i in ids], images, order


def derive_labels(qs, ans, ids, n_img):
    """Per-image shape / colour index (-1: not determined) from easy-vqa questions' answers."""
    cand_s = [set(SHAPES) for _ in range(n_img)]
    cand_c = [set(COLORS) for _ in range(n_img)]
    for q, a, i in zip(qs, ans, ids):
        t, sl = parse_question(q)
        cs, cc = cand_s[i], cand_c[i]
        if t.startswith("what"):
            if "color" in t.replace("{color}", ""):  # asks for the colour
                cc &= {a}
                if "shape" in sl:
                    cs &= {sl["shape"]}
            else:  # asks for the shape
                cs &= {a}
                if "color" in sl:
                    cc &= {sl["color"]}
        else:
            neg = " not " in t or " no " in t
            truth = (a == "yes") != neg
            key, cand = ("color", cc) if "color" in sl else ("shape", cs)
            if truth:
                cand &= {sl[key]}
            else:
                cand.discard(sl[key])
    shape = [SHAPES.index(next(iter(c))) if len(c) == 1 else -1 for c in cand_s]
    color = [COLORS.index(next(iter(c))) if len(c) == 1 else -1 for c in cand_c]
    return shape, color


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--gguf", default=None)
    p.add_argument("--out", required=True)
    p.add_argument("--device", default="cuda")
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--wd", type=float, default=0.05)
    p.add_argument("--warmup", type=int, default=0, help="warm-up steps (0: one epoch)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--paraphrase-prob", type=float, default=0.5)
    p.add_argument("--capitalize-prob", type=float, default=0.5)
    p.add_argument("--aux-weight", type=float, default=0.5)
    p.add_argument("--time-budget", type=float, default=0,
                   help="after epoch 1, cut the epochs to what fits in N seconds")
    p.add_argument("--val-images", type=int, default=400, help="last N train images held out")
    p.add_argument("--max-questions", type=int, default=0, help="smoke test: cap train questions")
    p.add_argument("--max-val", type=int, default=0, help="smoke test: cap eval questions")
    p.add_argument("--time-limit", type=float, default=0, help="stop training after N seconds")
    a = p.parse_args(argv)

    import numpy as np
    import torch
    import torch.nn.functional as F
    from safetensors.torch import save_file

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    fh = open(out / "train.log", "w")
    log(f"args: {vars(a)}", fh)
    random.seed(a.seed)
    np.random.seed(a.seed)
    torch.manual_seed(a.seed)
    dev = torch.device(a.device)
    if dev.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        log(f"device: {torch.cuda.get_device_name(0)} torch {torch.__version__}", fh)

    gguf = Path(a.gguf) if a.gguf else T.find_smollm2_gguf()
    tok = T.make_tokenizer(gguf, out / "tokenizer")
    # bf16 on the GPU; float32 on CPUs (smoke tests: bf16 matmuls are very slow without AVX-512 BF16)
    lm_dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    lm = T.load_smollm2(gguf, dtype=lm_dtype).to(dev).eval()
    for prm in lm.parameters():
        prm.requires_grad_(False)
    tower, proj = T.make_vision_modules()
    tower.to(dev).train()
    proj.to(dev).train()
    n_params = sum(x.numel() for x in list(tower.parameters()) + list(proj.parameters()))
    log(f"trainable params (saved): {n_params}; image tokens {T.NUM_IMAGE_TOKENS}", fh)
    hid = T.VISION["hidden_size"]
    aux_heads = torch.nn.ModuleDict({"shape": torch.nn.Linear(hid, len(SHAPES)),
                                     "color": torch.nn.Linear(hid, len(COLORS))}).to(dev).train()

    t0 = time.time()
    tq, ta, ti, timgs, _ = load_split("train")
    eq, ea, ei, eimgs, _ = load_split("test")
    log(f"data: train {len(tq)} q / {len(timgs)} img, test {len(eq)} q / {len(eimgs)} img "
        f"({time.time() - t0:.1f}s)", fh)
    n_img = len(timgs)
    val_cut = n_img - a.val_images
    train_idx = [k for k in range(len(tq)) if ti[k] < val_cut]
    val_idx = [k for k in range(len(tq)) if ti[k] >= val_cut]
    if a.max_questions:
        train_idx = train_idx[: a.max_questions]
    shape_lab, color_lab = derive_labels(tq, ta, ti, n_img)
    for k in range(val_cut, n_img):  # held-out images: no labels used
        shape_lab[k] = color_lab[k] = -1
    log(f"aux labels: shape {sum(x >= 0 for x in shape_lab)}, colour {sum(x >= 0 for x in color_lab)} "
        f"of {val_cut} training images", fh)
    shape_lab = torch.tensor(shape_lab, device=dev)
    color_lab = torch.tensor(color_lab, device=dev)
    timgs = timgs.to(dev)
    eimgs = eimgs.to(dev)

    end_ids = tok(T.END_TOKEN, add_special_tokens=False).input_ids
    answer_ids = {ans: tok(ans + T.END_TOKEN, add_special_tokens=False).input_ids
                  for ans in set(ta) | set(ea)}
    prompt_cache: dict[str, list[int]] = {}

    def encode(question: str, answer: str):
        ids = prompt_cache.get(question)
        if ids is None:
            raw = tok(T.make_prompt(question)).input_ids
            k = raw.index(T.IMAGE_TOKEN_ID)
            ids = raw[:k] + [T.IMAGE_TOKEN_ID] * T.NUM_IMAGE_TOKENS + raw[k + 1:]
            prompt_cache[question] = ids
        return ids, answer_ids[answer]

    def make_batch(items):
        """items: (question, answer, image_index) -> tensors."""
        seqs, labs = [], []
        for q, ans, _ in items:
            pi, ai = encode(q, ans)
            seqs.append(pi + ai)
            labs.append([-100] * len(pi) + ai)
        L = max(len(s) for s in seqs)
        ids = torch.full((len(seqs), L), end_ids[0], dtype=torch.long)
        lab = torch.full((len(seqs), L), -100, dtype=torch.long)
        am = torch.zeros((len(seqs), L), dtype=torch.long)
        for r, (s, l_) in enumerate(zip(seqs, labs)):
            ids[r, : len(s)] = torch.tensor(s)
            lab[r, : len(l_)] = torch.tensor(l_)
            am[r, : len(s)] = 1
        return ids.to(dev), lab.to(dev), am.to(dev)

    def forward(ids, am, pix):
        with torch.autocast(device_type=dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda"):
            out = tower(pixel_values=pix, output_hidden_states=True)
            feats = out.hidden_states[-1][:, 1:]  # what vLLM's LLaVA reads (CLS dropped)
            img = proj(feats)  # B, N, 576
        emb = lm.model.embed_tokens(ids)
        mask = (ids == T.IMAGE_TOKEN_ID).unsqueeze(-1)
        emb = emb.masked_scatter(mask, img.to(emb.dtype).reshape(-1, emb.shape[-1]))
        h = lm.model(inputs_embeds=emb, attention_mask=am).last_hidden_state
        return h, feats

    def aux_loss(feats, img_idx):
        pooled = feats.float().mean(1)
        loss = 0.0
        for name, labs in (("shape", shape_lab), ("color", color_lab)):
            y = labs[img_idx]
            loss = loss + F.cross_entropy(aux_heads[name](pooled), y, ignore_index=-1)
        return loss

    def loss_and_correct(ids, lab, am, pix, img_idx=None):
        h, feats = forward(ids, am, pix)
        # logits at position t predict token t+1
        tgt = lab[:, 1:]
        sel = tgt != -100
        logits = lm.lm_head(h[:, :-1][sel]).float()
        loss = F.cross_entropy(logits, tgt[sel])
        ok = (logits.argmax(-1) == tgt[sel])
        wrong = torch.zeros_like(tgt, dtype=torch.long)
        wrong[sel] = (~ok).long()
        correct = (wrong.sum(1) == 0)
        if img_idx is not None and a.aux_weight > 0:
            return loss, correct, aux_loss(feats, img_idx)
        return loss, correct

    def augment(pix):
        # flips / 90-degree turns: shape and colour answers are unchanged
        if random.random() < 0.5:
            pix = pix.flip(-1)
        if random.random() < 0.5:
            pix = pix.flip(-2)
        if random.random() < 0.5:
            pix = pix.transpose(-1, -2)
        return pix

    @torch.no_grad()
    def evaluate(items, imgs, bs=512):
        tower.eval(), proj.eval()
        n = c = 0
        for s in range(0, len(items), bs):
            chunk = items[s: s + bs]
            ids, lab, am = make_batch(chunk)
            pix = imgs[torch.tensor([it[2] for it in chunk], device=dev)]
            _, correct = loss_and_correct(ids, lab, am, pix)
            n += len(chunk)
            c += int(correct.sum())
        tower.train(), proj.train()
        return c / max(n, 1)

    params = [x for x in list(tower.parameters()) + list(proj.parameters()) + list(aux_heads.parameters())]
    decay = [x for x in params if x.ndim >= 2]
    no_decay = [x for x in params if x.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.wd},
                             {"params": no_decay, "weight_decay": 0.0}], lr=a.lr, betas=(0.9, 0.98))
    steps_per_epoch = math.ceil(len(train_idx) / a.batch)
    n_epochs = a.epochs
    total = steps_per_epoch * n_epochs
    warmup = a.warmup or steps_per_epoch

    def lr_at(step):
        if step < warmup:
            return a.lr * (step + 1) / warmup
        prog = (step - warmup) / max(1, total - warmup)
        return a.lr * 0.5 * (1 + math.cos(math.pi * min(1.0, prog)))

    val_items = [(tq[k], ta[k], ti[k]) for k in val_idx]
    if a.max_val:
        val_items = val_items[: a.max_val]
    log(f"train questions {len(train_idx)}, val questions {len(val_items)}, steps {total}", fh)
    step = 0
    t0 = time.time()
    history = []
    stopped_early = False
    epoch = 0
    while epoch < n_epochs:
        order = train_idx[:]
        random.shuffle(order)
        tot_loss = torch.zeros((), device=dev)
        tot_aux = torch.zeros((), device=dev)
        tot_c = torch.zeros((), device=dev, dtype=torch.long)
        tot_n = 0
        for s in range(0, len(order), a.batch):
            chunk = order[s: s + a.batch]
            items = []
            for k in chunk:
                q = tq[k]
                if random.random() < a.paraphrase_prob:
                    q = paraphrase(q, random.randrange(1000), TRAIN_PARAPHRASES)
                if random.random() < a.capitalize_prob:
                    q = q[:1].upper() + q[1:]
                items.append((q, ta[k], ti[k]))
            ids, lab, am = make_batch(items)
            img_idx = torch.tensor([it[2] for it in items], device=dev)
            pix = augment(timgs[img_idx])
            for g in opt.param_groups:
                g["lr"] = lr_at(step)
            if a.aux_weight > 0:
                loss, correct, aux = loss_and_correct(ids, lab, am, pix, img_idx)
                total_loss = loss + a.aux_weight * aux
            else:
                loss, correct = loss_and_correct(ids, lab, am, pix)
                aux = torch.zeros((), device=dev)
                total_loss = loss
            opt.zero_grad(set_to_none=True)
            total_loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            step += 1
            tot_loss += loss.detach() * len(chunk)
            tot_aux += aux.detach() * len(chunk)
            tot_c += correct.sum()
            tot_n += len(chunk)
            if a.time_limit and time.time() - t0 > a.time_limit:
                stopped_early = True
                break
        val_acc = evaluate(val_items, timgs)
        rec = {"epoch": epoch + 1, "step": step, "train_loss": float(tot_loss) / tot_n,
               "aux_loss": float(tot_aux) / tot_n,
               "train_acc": int(tot_c) / tot_n, "val_acc": val_acc, "elapsed_s": time.time() - t0}
        history.append(rec)
        log(json.dumps(rec), fh)
        epoch += 1
        if stopped_early:
            log("time limit reached: stopping", fh)
            break
        if epoch == 1 and a.time_budget:
            fit = max(1, int(a.time_budget / (time.time() - t0)))
            if fit < n_epochs:
                n_epochs = fit
                total = steps_per_epoch * n_epochs
                log(f"time budget {a.time_budget:.0f}s: epoch 1 took {time.time() - t0:.1f}s -> "
                    f"{n_epochs} epochs ({total} steps)", fh)

    # final measurements (no selection is made on them)
    test_items = [(q, ans, i) for q, ans, i in zip(eq, ea, ei)]
    para_items = [(paraphrase(q, n), ans, i) for n, (q, ans, i) in enumerate(test_items)]
    train_para_items = [(paraphrase(q, n, TRAIN_PARAPHRASES), ans, i)
                        for n, (q, ans, i) in enumerate(val_items)]
    if a.max_val:
        test_items, para_items = test_items[: a.max_val], para_items[: a.max_val]
    final = {
        "val_acc": evaluate(val_items, timgs),
        "val_train_paraphrase_acc": evaluate(train_para_items, timgs),
        "test_acc_teacher_forced": evaluate(test_items, eimgs),
        "test_eval_paraphrase_acc_teacher_forced": evaluate(para_items, eimgs),
        "steps": step,
        "epochs_run": len(history),
        "epochs_planned": n_epochs,
        "train_seconds": time.time() - t0,
    }
    log("final " + json.dumps(final), fh)

    state = {}
    for name, t in tower.state_dict().items():
        state["vision_tower." + name] = t.detach().to(torch.bfloat16).cpu().contiguous()
    for name, t in proj.state_dict().items():
        state["multi_modal_projector." + name] = t.detach().to(torch.bfloat16).cpu().contiguous()
    state = {k: state[k] for k in sorted(state)}
    save_file(state, str(out / T.WEIGHTS_FILE), metadata={"format": "pt"})
    summary = {"args": vars(a), "history": history, "final": final, "trainable_params": n_params,
               "device": torch.cuda.get_device_name(0) if dev.type == "cuda" else "cpu",
               "torch": torch.__version__}
    (out / "train_summary.json").write_text(json.dumps(summary, indent=2))
    log("saved " + str(out / T.WEIGHTS_FILE), fh)


if __name__ == "__main__":
    main()
