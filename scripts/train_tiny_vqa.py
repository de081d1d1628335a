"""Train tiny-vqa's vision tower + projector on easy-vqa (train split), SmolLM2 frozen.

GPU run (what produced weights/tiny-vqa; see its README.md):
    PYTHONPATH=src python scripts/train_tiny_vqa.py --gguf SmolLM2-135M-Instruct.Q4_1.gguf \
        --out OUTDIR --epochs 12 --batch 256 --seed 0
CPU smoke test on a tiny subset:
    PYTHONPATH=src python scripts/train_tiny_vqa.py --out /tmp/tvqa --device cpu \
        --max-questions 64 --max-val 32 --batch 8 --epochs 1 --val-images 20

Loss: cross-entropy on the answer tokens and the closing <|im_end|> only.  Accuracy here
is teacher-forced exact match of all answer tokens (the same as greedy decoding's answer).
Training questions are rewritten with a TRAIN_PARAPHRASES variant with probability
--paraphrase-prob; EVAL_PARAPHRASES are never used for training.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from vlmcache.models import tiny_vqa as T  # noqa: E402
from vlmcache.models.paraphrases import EVAL_PARAPHRASES, TRAIN_PARAPHRASES, paraphrase  # noqa: E402


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


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--gguf", default=None)
    p.add_argument("--out", required=True)
    p.add_argument("--device", default="cuda")
    p.add_argument("--epochs", type=int, default=12)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--wd", type=float, default=0.05)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--paraphrase-prob", type=float, default=0.3)
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
    lm = T.load_smollm2(gguf, dtype=torch.bfloat16).to(dev).eval()
    for prm in lm.parameters():
        prm.requires_grad_(False)
    tower, proj = T.make_vision_modules()
    tower.to(dev).train()
    proj.to(dev).train()
    n_params = sum(x.numel() for x in list(tower.parameters()) + list(proj.parameters()))
    log(f"trainable params: {n_params}", fh)

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
        with torch.autocast(device_type=dev.type, dtype=torch.bfloat16, enabled=True):
            img = T.image_features(tower, proj, pix)  # B, N, 576
        emb = lm.model.embed_tokens(ids)
        mask = (ids == T.IMAGE_TOKEN_ID).unsqueeze(-1)
        emb = emb.masked_scatter(mask, img.to(emb.dtype).reshape(-1, emb.shape[-1]))
        h = lm.model(inputs_embeds=emb, attention_mask=am).last_hidden_state
        return h

    def loss_and_correct(ids, lab, am, pix):
        h = forward(ids, am, pix)
        # logits at position t predict token t+1
        tgt = lab[:, 1:]
        sel = tgt != -100
        logits = lm.lm_head(h[:, :-1][sel]).float()
        loss = F.cross_entropy(logits, tgt[sel])
        ok = (logits.argmax(-1) == tgt[sel])
        wrong = torch.zeros_like(tgt, dtype=torch.long)
        wrong[sel] = (~ok).long()
        correct = (wrong.sum(1) == 0)
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

    params = [x for x in list(tower.parameters()) + list(proj.parameters())]
    decay = [x for x in params if x.ndim >= 2]
    no_decay = [x for x in params if x.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.wd},
                             {"params": no_decay, "weight_decay": 0.0}], lr=a.lr, betas=(0.9, 0.98))
    steps_per_epoch = math.ceil(len(train_idx) / a.batch)
    total = steps_per_epoch * a.epochs

    def lr_at(step):
        if step < a.warmup:
            return a.lr * (step + 1) / a.warmup
        prog = (step - a.warmup) / max(1, total - a.warmup)
        return a.lr * 0.5 * (1 + math.cos(math.pi * min(1.0, prog)))

    val_items = [(tq[k], ta[k], ti[k]) for k in val_idx]
    if a.max_val:
        val_items = val_items[: a.max_val]
    log(f"train questions {len(train_idx)}, val questions {len(val_items)}, steps {total}", fh)
    step = 0
    t0 = time.time()
    history = []
    stopped_early = False
    for epoch in range(a.epochs):
        order = train_idx[:]
        random.shuffle(order)
        tot_loss = 0.0
        tot_c = tot_n = 0
        for s in range(0, len(order), a.batch):
            chunk = order[s: s + a.batch]
            items = []
            for k in chunk:
                q = tq[k]
                if random.random() < a.paraphrase_prob:
                    q = paraphrase(q, random.randrange(1000), TRAIN_PARAPHRASES)
                items.append((q, ta[k], ti[k]))
            ids, lab, am = make_batch(items)
            pix = augment(timgs[torch.tensor([it[2] for it in items], device=dev)])
            for g in opt.param_groups:
                g["lr"] = lr_at(step)
            loss, correct = loss_and_correct(ids, lab, am, pix)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            step += 1
            tot_loss += float(loss.detach()) * len(chunk)
            tot_c += int(correct.sum())
            tot_n += len(chunk)
            if a.time_limit and time.time() - t0 > a.time_limit:
                stopped_early = True
                break
        val_acc = evaluate(val_items, timgs)
        rec = {"epoch": epoch + 1, "step": step, "train_loss": tot_loss / tot_n,
               "train_acc": tot_c / tot_n, "val_acc": val_acc, "elapsed_s": time.time() - t0}
        history.append(rec)
        log(json.dumps(rec), fh)
        if stopped_early:
            log("time limit reached: stopping", fh)
            break

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
