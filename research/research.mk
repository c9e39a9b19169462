# The laboratory's targets, included by the Makefile (`make <target>` from the repository root): the
# evaluation grids, learning curves, judge splits and the library's benches behind docs/, each a
# `python -m research <command>` (research/README.md). The variables they share with the product's
# targets (BIN, OPENBOOK_DATA) and the targets they depend on (install, setfit) are the Makefile's.

# The records committed under docs/ were made while a training run kept the dev checks' best weights, the
# default until the keep-judge's rule (docs/decisions.md, "The kept weights in the service's jobs"). Their
# targets say so, and so resume; a directory records what it kept and refuses a run that keeps the other.
KEPT_BEST := --keep best

.PHONY: eval-sst2 eval-training eval-pairs eval-methods eval-continual eval-full-sst2 table-16shot table-16shot-default learning-curve learning-curve-setfit knn-selection demos-dev budget-dev backbone-dev embeddings-dev parts-dev repro-dev lr-dev fresh-splits budget-fresh judged-splits contrastive-judge judged-splits-2 contrastive-judge-2 judged-splits-3 keep-judge judged-splits-4 layer-judge judged-splits-5 readers-judge readers-judge-2 readers-judge-s12 two-readers-probe two-readers-probe3 two-readers-probe4 two-readers-probe5 two-readers-probe6 two-readers-probe7 table-16shot-readers clinc150-readers clinc150-readers-trained learning-curve-readers clinc150 clinc150-trained clinc150-scoring-dev clinc150-vectors-trained-dev clinc150-vectors-trained clinc150-objective-dev clinc150-budget-dev precision-dev precision-dev-clinc150 curve-gate-dev curve-keep-dev curve-floor-dev ipt-table bench refusal-judge-splits refusal-judge clinc150-readers-refusals-s13 clinc150-served few-dev-judge

eval-sst2: install
	$(BIN)/python -m research eval --data $(OPENBOOK_DATA)/k-shot --task SST-2 \
		--methods zero-shot,knn,knn-interp --seeds 13,21,42,87,100 --out results/sst2

# The trained-methods table of docs/experiments/trained-methods-smollm2-135m.md (smollm2-135m, 32 steps). Its records were made with plain cosine kNN
# and the token-embedding table trained, since changed: its directory refuses a rerun under today's defaults
# (the kNN setting differs), so OUT=dir runs the command afresh there; resumable, over several sittings.
eval-training: install
	$(BIN)/python -m research eval $(KEPT_BEST) --data $(OPENBOOK_DATA)/k-shot --task SST-2,trec,mpqa,sst-5 --backbone smollm2-135m --steps 32 \
		--methods prompt-ft,retroprompt/demos=neural/knn-loss,retroprompt/knn-loss,retroprompt/demos=neural,retroprompt/demos=neural/knn-loss/no-knn-infer \
		--seeds 13,21,42,87,100 --out $(or $(OUT),docs/results/training)

# The sentence-pair tasks, two seeds, on PAIRS_BACKBONE with the defaults of when it ran: the 16-shot table's
# methods, retroprompt with neural demonstrations (the default then) and the paper's configuration
# (retroprompt/demos=neural/knn-loss), but not the earlier default the 16-shot table keeps as a record.
# Prompts may run to 256 tokens: 4 of 32 train and 11 of 32 dev pairs of RTE seed 13 are longer than the
# default 128 (no test pair was read to choose this). QNLI is scored on a fixed seed-0 sample of 1000 of its
# 5463 test pairs; RTE's 277 are all kept. Resumable; PARALLEL=N as below.
PAIRS_BACKBONE ?= gemma3-270m
eval-pairs: setfit
	$(BIN)/python -m research eval $(KEPT_BEST) --data $(OPENBOOK_DATA)/k-shot --task RTE,QNLI --backbone $(PAIRS_BACKBONE) \
		--methods zero-shot,knn,knn-interp,prompt-ft,retroprompt/demos=neural,retroprompt/demos=neural/knn-loss,setfit \
		--seeds 13,21 --max-length 256 --test-size 1000 --parallel $(PARALLEL) --out docs/results/pairs-$(PAIRS_BACKBONE)

# The methods table: every prompt-optimisation method and the SetFit peer (an optional extra, installed
# here), 16-shot, 3 seeds, smollm2-135m and 32 steps as it was made; resumable like eval-training.
eval-methods: setfit
	$(BIN)/python -m research eval $(KEPT_BEST) --data $(OPENBOOK_DATA)/k-shot --task SST-2,trec,mpqa,sst-5 --backbone smollm2-135m --steps 32 \
		--methods dart,ipt,ipt/strategy=random,prompt-tuning,prefix-tuning,p-tuning,linear-probe,l2p,setfit \
		--seeds 13,21,42 --out $(or $(OUT),docs/results/methods)

# The fully supervised reference: prompt-ft and the paper's configuration on SST-2's full training set (6920
# sentences), tested on the same 872 sentences as the 16-shot runs (data.FULL_LAYOUT). The budget is
# fixed, not selected: 1000 steps of 8 (about 1.2 epochs), the best dev checkpoint kept. Hours of CPU.
eval-full-sst2: install
	$(BIN)/python -m research eval $(KEPT_BEST) --full --data $(OPENBOOK_DATA)/full --task SST-2 --methods prompt-ft,retroprompt/demos=neural/knn-loss \
		--seeds 13 --steps 1000 --eval-every 100 --patience 3 --out $(or $(OUT),docs/results/full)

# The 16-shot table of the accuracy targets (docs/results.md, "Where the accuracy targets stand"), made once
# every default is chosen on dev: the frozen prompt (zero-shot, knn, knn-interp), prompt-ft at the default
# budget, the default retroprompt (no demonstrations, no kNN-guided loss), the default before the judge's rule
# (retroprompt/demos=neural), the paper's configuration (retroprompt/demos=neural/knn-loss), the default before
# the demonstrations and the loss were first decided (retroprompt/knn-loss) and the SetFit peer, 4 tasks x 5
# seeds, with the defaults as they stand (centred kNN scoring). Resumable; PARALLEL=N as below.
TABLE_BACKBONE ?= gemma3-270m
table-16shot: setfit
	$(BIN)/python -m research eval $(KEPT_BEST) --data $(OPENBOOK_DATA)/k-shot --task SST-2,trec,mpqa,sst-5 --backbone $(TABLE_BACKBONE) \
		--methods zero-shot,knn,knn-interp,prompt-ft,retroprompt,retroprompt/demos=neural,retroprompt/demos=neural/knn-loss,retroprompt/knn-loss,setfit \
		--seeds 13,21,42,87,100 --parallel $(PARALLEL) --out docs/results/16shot-$(TABLE_BACKBONE)

# The table's trained rows above kept the dev checks' best weights, the default when they ran; the default
# row as it ships, its runs keeping their last weights, goes to a directory of its own (a directory holds
# runs of one kind). The same splits and seeds, so its rows read against the table's.
table-16shot-default: install
	$(BIN)/python -m research eval --data $(OPENBOOK_DATA)/k-shot --task SST-2,trec,mpqa,sst-5 --backbone $(TABLE_BACKBONE) \
		--methods retroprompt --seeds 13,21,42,87,100 --parallel $(PARALLEL) --out docs/results/16shot-default-$(TABLE_BACKBONE)

# The learning curve of the accuracy targets (docs/results.md, "Learning curve"): SST-2 and trec, seeds 13
# and 21, both labelling orders, the service against knn-interp, prompt-ft and SetFit, on CURVE_BACKBONE
# (the default backbone unless given). Resumable, each (task, seed, order) unit merged into the output as it
# ends; PARALLEL=N runs N units at once (on a GPU, all 8: PARALLEL=8 CURVE_DEVICE=cuda; on a 2-core CPU, 1,
# so that each unit ends soonest: a unit stopped midway starts again). The service runs as it ships: the
# default method (CURVE_METHOD), its jobs keeping their last weights (CURVE_KEEP). The curve of neural
# demonstrations and the dev checks' best weights: CURVE_METHOD=retroprompt/demos=neural CURVE_KEEP=best
# CURVE_OUT=docs/learning-curve-$(CURVE_BACKBONE). CURVE_BASELINES=knn-interp,prompt-ft leaves SetFit-MPNet,
# the slow one on a CPU, to learning-curve-setfit, which adds it to the same records (same examples).
CURVE_BACKBONE ?= $(TABLE_BACKBONE)
CURVE_DEVICE ?= cpu
CURVE_METHOD ?= retroprompt
CURVE_KEEP ?= last
CURVE_BASELINES ?= knn-interp,prompt-ft,setfit
CURVE_DIR = $(or $(CURVE_OUT),docs/learning-curve-retroprompt-$(CURVE_BACKBONE))
CURVE_UNITS = --data $(OPENBOOK_DATA)/full --task SST-2,trec --seeds 13,21 --rounds 2,4,8,16,32 --test-size 500 \
	--pool-size 500 --method $(CURVE_METHOD) --keep $(CURVE_KEEP) --backbone $(CURVE_BACKBONE) \
	--device $(CURVE_DEVICE) --parallel $(PARALLEL) --out $(CURVE_DIR)
learning-curve: setfit
	$(BIN)/python -m research learning-curve $(CURVE_UNITS) --orders fixed,uncertainty --baselines $(CURVE_BASELINES)

# The same curve with the service's tasks reading their book with the sentence reader (two readers), the
# fixed order, beside the untrained task (whose knn-interp then reads the reader's book); prompt-ft and
# SetFit-MPNet, which read no book of ours, are copied from the curve above once the units are in
# (the same tasks, seeds, rounds, examples and test sample; checked), not trained again.
READERS_CURVE_DIR = docs/learning-curve-readers-$(CURVE_BACKBONE)
learning-curve-readers: setfit
	$(BIN)/python -m research learning-curve $(subst $(CURVE_DIR),$(READERS_CURVE_DIR),$(CURVE_UNITS)) \
		--orders fixed --reader mpnet --baselines knn-interp
	$(BIN)/python -m research learning-curve --out $(READERS_CURVE_DIR) --baselines prompt-ft,setfit \
		--baselines-from docs/learning-curve-retroprompt-$(CURVE_BACKBONE)
# Probe 9 (docs/experiments/two-readers.md: the rule, written before this ran): k-shot splits of 2, 4 and 8
# examples per label (seeds FEW_DEV_SEEDS, and 500 examples apart from them as each task's judge set), each
# seed's training split fitted as a service job fits posted examples (`research served`: dev held out by
# hash), the version read on the judge set at the λ its job chose and at λ set; `make -j2 few-dev-judge` runs
# two shot counts at once. Resumable (task, seed) by (task, seed).
FEW_DEV_DATA ?= openbook-data/few-dev-k-shot
FEW_DEV_SEEDS = 4001,4002,4003
few-dev-judge: few-dev-judge-2 few-dev-judge-4 few-dev-judge-8
few-dev-judge-%: setfit
	$(BIN)/python -m research splits --data $(OPENBOOK_DATA) --task SST-2,trec,mpqa,sst-5 --seeds $(FEW_DEV_SEEDS) \
		--shots $* --judge 500 --out $(FEW_DEV_DATA)-$*
	$(BIN)/python -m research served --data $(FEW_DEV_DATA)-$* --task SST-2,trec,mpqa,sst-5 --shots $* \
		--seeds $(FEW_DEV_SEEDS) --backbone $(TABLE_BACKBONE) --device $(READERS_DEVICE) --at-lam 0.25,0.5,0.75 \
		--out docs/results/few-dev-judge-$*-$(TABLE_BACKBONE)
learning-curve-setfit: setfit
	$(BIN)/python -m research learning-curve $(CURVE_UNITS) --orders fixed --baselines setfit --baselines-only

# The first gate against the untrained task, judged on a curve scored on 500 held-out training examples
# (docs/decisions.md, "The first gate": the rule, written before this ran; test is never read): the
# fixed order, the gate off and on, beside the untrained task (knn-interp) on the same examples.
GATE_CURVE = --data $(OPENBOOK_DATA)/full --task SST-2,trec --seeds 13,21 --rounds 2,4,8,16,32 --judge 500 \
	--orders fixed --baselines knn-interp --backbone $(CURVE_BACKBONE) --device $(CURVE_DEVICE) --parallel $(PARALLEL)
# The gate on ran first: its rule needs the gate off only if, with it on, no round serves below the
# untrained task (it did not hold, so the gate-off curve was not run).
curve-gate-dev: install
	$(BIN)/python -m research learning-curve $(GATE_CURVE) --untrained-gate --keep best \
		--out docs/learning-curve-gate-on-$(CURVE_BACKBONE)
	$(BIN)/python -m research learning-curve $(GATE_CURVE) --keep best --out docs/learning-curve-gate-off-$(CURVE_BACKBONE)

# The jobs' kept weights, the last instead of the dev checks' best (docs/decisions.md, "The kept weights
# in the service's jobs": the rule, written before this ran), against the gate-on curve above.
curve-keep-dev: install
	$(BIN)/python -m research learning-curve $(GATE_CURVE) --untrained-gate --keep last \
		--out docs/learning-curve-keep-last-$(CURVE_BACKBONE)

# The budget's floor in the service's jobs (docs/decisions.md, "The budget's floor in the service's jobs":
# the rule, written before this ran): the curve above, its jobs on 8 epochs with no floor of steps.
curve-floor-dev: install
	$(BIN)/python -m research learning-curve $(GATE_CURVE) --untrained-gate --keep last --epochs 8 --max-steps 120 \
		--out docs/learning-curve-no-floor-$(CURVE_BACKBONE)

# Class-incremental SST-2 -> trec -> mpqa, no task id at test time: average accuracy and forgetting
# (smollm2-135m, 32 steps). Made with plain cosine kNN, since changed: OUT=dir runs it afresh there.
eval-continual: install
	$(BIN)/python -m research continual $(KEPT_BEST) --data $(OPENBOOK_DATA)/k-shot --stages SST-2,trec,mpqa --backbone smollm2-135m --steps 32 \
		--methods l2p,prompt-ft,retroprompt/demos=neural/knn-loss --seeds 13,21,42 --out $(or $(OUT),docs/results/continual)

# The nested dev-only check behind knn-interp's selection rule (docs/knn-selection.md): the frozen
# prompt on 4 tasks x 5 seeds, then the paper's configuration (retroprompt/demos=neural/knn-loss) trained on seed 13. Reads train and dev, never test.
knn-selection: install
	$(BIN)/python -m research knn-selection --data $(OPENBOOK_DATA)/k-shot --out results/knn-selection
	$(BIN)/python -m research knn-selection --data $(OPENBOOK_DATA)/k-shot --seeds 13 --trained retroprompt/demos=neural/knn-loss \
		--out results/knn-selection-retroprompt

# The dev-only comparisons that choose the defaults still open (docs/experiments/trained-methods-smollm2-135m.md, "The default
# demonstrations", and docs/experiments/training-budget-and-backbone.md), on 4 tasks x 5 seeds, dev accuracy only
# (no test example is read): demos-dev runs every demonstration mode, and prompt-ft; budget-dev runs
# prompt-ft and retroprompt as they then were (no demonstrations, the kNN-guided loss, the token-embedding
# table trained) with the epoch budget that competes with 32 steps (20 epochs, a dev check
# each, patience 4 epochs, at most 120 steps), its kNN scored by plain cosine like the 32-step records. DEV_BACKBONE=gemma3-270m compares the other backbone.
# Resumable; on a CPU, run a task at a time (DEV_TASKS=trec). PARALLEL=N runs the grid's units as N processes
# into the same directory: per (task, seed), the untrained methods together and each trained method alone
# (on a GPU, all at once, e.g. PARALLEL=20; `python -m research eval --device auto`, its default, finds the GPU).
PARALLEL ?= 1
DEV_BACKBONE ?= smollm2-135m
DEV_TASKS ?= SST-2,trec,mpqa,sst-5
DEV_METHODS = prompt-ft,retroprompt/knn-loss,retroprompt/demos=neural/knn-loss,retroprompt/demos=words/knn-loss,retroprompt/demos=text/knn-loss
demos-dev: install
	$(BIN)/python -m research eval $(KEPT_BEST) --no-test --data $(OPENBOOK_DATA)/k-shot --task $(DEV_TASKS) --backbone $(DEV_BACKBONE) \
		--methods $(DEV_METHODS) --seeds 13,21,42,87,100 --parallel $(PARALLEL) --out docs/results/dev-$(DEV_BACKBONE)

budget-dev: install
	$(BIN)/python -m research eval $(KEPT_BEST) --no-test --data $(OPENBOOK_DATA)/k-shot --task $(DEV_TASKS) --backbone $(DEV_BACKBONE) \
		--methods prompt-ft/no-freeze-embeddings,retroprompt/no-freeze-embeddings/knn-loss \
		--seeds 13,21,42,87,100 --epochs 20 --patience 4 --max-steps 120 \
		--knn-similarity cosine --parallel $(PARALLEL) --out docs/results/budget-dev-$(DEV_BACKBONE)

# The backbone under 32 steps (docs/experiments/training-budget-and-backbone.md, "The training budget, chosen on dev", step 2): retroprompt as
# the default then was (no demonstrations, the kNN-guided loss, the token-embedding table trained), the method
# the rule reads, on DEV_BACKBONE, run as the 32-step records of docs/results/training were (32
# steps, a dev check every 8, patience 2, plain cosine kNN), dev only. Resumable; PARALLEL=N as above.
backbone-dev: install
	$(BIN)/python -m research eval $(KEPT_BEST) --no-test --data $(OPENBOOK_DATA)/k-shot --task $(DEV_TASKS) --backbone $(DEV_BACKBONE) \
		--methods retroprompt/no-freeze-embeddings/knn-loss --seeds 13,21,42,87,100 --steps 32 \
		--eval-every 8 --patience 2 \
		--knn-similarity cosine --parallel $(PARALLEL) --out docs/results/backbone-dev-$(DEV_BACKBONE)

# Full fine-tuning with the token-embedding table frozen (docs/experiments/training-step-and-embedding-table.md, "The token-embedding table,
# chosen on dev"): retroprompt/knn-loss (the table frozen) run as backbone-dev runs it (32 steps, a dev check
# every 8, patience 2, plain cosine kNN), dev only, compared with backbone-dev's records. Resumable;
# PARALLEL=N as above. EMBEDDINGS_METHODS=retroprompt/knn-loss,retroprompt/no-freeze-embeddings/knn-loss
# runs both sides.
EMBEDDINGS_METHODS ?= retroprompt/knn-loss
embeddings-dev: install
	$(BIN)/python -m research eval $(KEPT_BEST) --no-test --data $(OPENBOOK_DATA)/k-shot --task $(DEV_TASKS) --backbone $(DEV_BACKBONE) \
		--methods $(EMBEDDINGS_METHODS) --seeds 13,21,42,87,100 --steps 32 --eval-every 8 --patience 2 \
		--knn-similarity cosine --parallel $(PARALLEL) --out docs/results/embeddings-dev-$(DEV_BACKBONE)

# RetroPrompt's kNN-guided loss under the default budget (docs/experiments/retroprompt-parts-gemma3-270m.md, "RetroPrompt's parts under the
# default budget"): the chosen demonstrations (neural, by the rule there) without it on DEV_BACKBONE, dev only,
# 4 tasks x 5 seeds: since the rule dropped the loss, that was the default retroprompt until the judge's rule
# dropped the demonstrations. The side with it is the dev accuracy that table-16shot's
# retroprompt/demos=neural/knn-loss runs record. The directory also holds retroprompt runs (no demonstrations). Resumable; PARALLEL=N as above.
PARTS_METHODS ?= retroprompt/demos=neural
parts-dev: install
	$(BIN)/python -m research eval $(KEPT_BEST) --no-test --data $(OPENBOOK_DATA)/k-shot --task $(DEV_TASKS) --backbone $(DEV_BACKBONE) \
		--methods $(PARTS_METHODS) --seeds 13,21,42,87,100 --parallel $(PARALLEL) \
		--out docs/results/parts-dev-$(DEV_BACKBONE)

# A dev-only rerun of table-16shot's kNN-guided-loss runs, with and without demonstrations, on seed 13 of SST-2
# and trec: it must give the dev accuracy the table recorded, to the example, before dev-only grids are compared
# with the table's dev records.
repro-dev: install
	$(BIN)/python -m research eval $(KEPT_BEST) --no-test --data $(OPENBOOK_DATA)/k-shot --task SST-2,trec --backbone $(TABLE_BACKBONE) \
		--methods retroprompt/knn-loss,retroprompt/demos=neural/knn-loss --seeds 13 --parallel $(PARALLEL) \
		--out docs/results/repro-dev-$(TABLE_BACKBONE)

# The learning rate under the default budget (docs/experiments/learning-rate.md, "The learning rate under the default
# budget"): retroprompt as the demonstrations and kNN-loss rules then decided it (neural demonstrations), at LR
# on DEV_BACKBONE, dev only, 4 tasks x 5 seeds; the dev accuracy of parts-dev's runs of it is the 1e-5 side. The
# directory also holds three retroprompt/knn-loss runs (no demonstrations), made before those choices. Resumable; PARALLEL=N as above.
LR ?= 3e-05
LR_METHOD ?= retroprompt/demos=neural
lr-dev: install
	$(BIN)/python -m research eval $(KEPT_BEST) --no-test --data $(OPENBOOK_DATA)/k-shot --task $(DEV_TASKS) --backbone $(DEV_BACKBONE) \
		--methods $(LR_METHOD) --lr $(LR) --seeds 13,21,42,87,100 --parallel $(PARALLEL) \
		--out docs/results/lr-dev-$(LR)-$(DEV_BACKBONE)

# Fresh 16-shot train and dev splits, seeds 1001-1005, drawn from the full training sets with no text that
# the standard splits score (their dev and test): evidence for a candidate that the standard dev sets
# suggested (research/splits.py). Written outside the repository, for `python -m research eval --data $(FRESH_DATA)`.
FRESH_DATA ?= openbook-data/fresh-k-shot
fresh-splits: install
	$(BIN)/python -m research splits --data $(OPENBOOK_DATA) --task SST-2,trec,mpqa,sst-5 --seeds 1001,1002,1003,1004,1005 \
		--out $(FRESH_DATA)

# The budget with a floor of epochs, on the fresh splits (docs/experiments/budget-floor-fresh-splits.md, "A floor of epochs, on fresh
# splits"): retroprompt as it then was (no demonstrations, the kNN-guided loss) on DEV_BACKBONE under 32 steps, then under at least 8 epochs and 32 steps (a dev check
# every 8 steps, patience 2 checks, at most 120 steps), dev only, 4 tasks x seeds 1001-1005. Resumable.
FRESH_SEEDS = 1001,1002,1003,1004,1005
budget-fresh: fresh-splits
	$(BIN)/python -m research eval $(KEPT_BEST) --no-test --data $(FRESH_DATA) --task $(DEV_TASKS) --backbone $(DEV_BACKBONE) \
		--methods retroprompt/knn-loss --seeds $(FRESH_SEEDS) --steps 32 --eval-every 8 --patience 2 \
		--parallel $(PARALLEL) \
		--out docs/results/budget-fresh-32-$(DEV_BACKBONE)
	$(BIN)/python -m research eval $(KEPT_BEST) --no-test --data $(FRESH_DATA) --task $(DEV_TASKS) --backbone $(DEV_BACKBONE) \
		--methods retroprompt/knn-loss --seeds $(FRESH_SEEDS) --epochs 8 --min-steps 32 --max-steps 120 \
		--eval-every 8 \
		--patience 2 --parallel $(PARALLEL) --out docs/results/budget-fresh-floor-$(DEV_BACKBONE)

# The contrastive loss and the neural demonstrations, judged on fresh splits (docs/decisions.md, "The
# contrastive loss, judged apart from selection": the rule, written before this grid ran). Seeds 2001-2005
# of 4 tasks drawn from the full training sets with 500 examples per task set apart as a judge (the
# splits' test.csv: no run chooses anything on it, and the real test sets are never read). Per unit, four
# trainings: the default retroprompt as it then was (neural demonstrations), with the contrastive loss, and
# both without demonstrations (today's default, and with the loss); the prompt alone (no-knn-infer) shares
# its training. Resumable; PARALLEL=N as above (on a GPU, all 20).
JUDGE_DATA ?= openbook-data/judged-k-shot
# Fresh 16-shot splits with a judge set of 500 per task apart from train and dev; each judge grid has its own.
JUDGED_SPLITS = $(BIN)/python -m research splits --data $(OPENBOOK_DATA) --task SST-2,trec,mpqa,sst-5 --judge 500
JUDGE_SEEDS = 2001,2002,2003,2004,2005
JUDGE_TASKS ?= trec,SST-2,mpqa,sst-5
JUDGE_METHODS = retroprompt/demos=neural,retroprompt/demos=neural/no-knn-infer,retroprompt/demos=neural/contrastive=1.0,retroprompt/demos=neural/no-knn-infer/contrastive=1.0,retroprompt,retroprompt/contrastive=1.0
judged-splits: install
	$(JUDGED_SPLITS) --seeds $(JUDGE_SEEDS) --out $(JUDGE_DATA)

contrastive-judge: judged-splits
	$(BIN)/python -m research eval $(KEPT_BEST) --data $(JUDGE_DATA) --task $(JUDGE_TASKS) --backbone $(TABLE_BACKBONE) \
		--methods $(JUDGE_METHODS) --seeds $(JUDGE_SEEDS) --parallel $(PARALLEL) \
		--out docs/results/contrastive-judge-$(TABLE_BACKBONE)

# The contrastive loss on today's default, on fresh seeds (docs/decisions.md, "The contrastive loss on the
# default without demonstrations": the rule, written before this grid ran). Seeds 2006-2010 and a judge
# set of their own; per unit, two trainings (the prompt alone and the store alone are each run's
# readings). Resumable; PARALLEL=N as above (on a GPU, all 20).
JUDGE2_DATA ?= openbook-data/judged-k-shot-2
JUDGE2_SEEDS = 2006,2007,2008,2009,2010
JUDGE2_METHODS = retroprompt,retroprompt/contrastive=1.0
judged-splits-2: install
	$(JUDGED_SPLITS) --seeds $(JUDGE2_SEEDS) --out $(JUDGE2_DATA)

contrastive-judge-2: judged-splits-2
	$(BIN)/python -m research eval $(KEPT_BEST) --data $(JUDGE2_DATA) --task $(JUDGE_TASKS) --backbone $(TABLE_BACKBONE) \
		--methods $(JUDGE2_METHODS) --seeds $(JUDGE2_SEEDS) --parallel $(PARALLEL) \
		--out docs/results/contrastive-judge-2-$(TABLE_BACKBONE)

# The kept weights in the library's default (docs/decisions.md, "The kept weights in the service's jobs",
# its second rule, written before this grid ran): the default with the best weights and with the last,
# seeds 2011-2015 and a judge set of their own. Resumable; PARALLEL=N as above (on a GPU, all 20 each).
JUDGE3_DATA ?= openbook-data/judged-k-shot-3
JUDGE3_SEEDS = 2011,2012,2013,2014,2015
judged-splits-3: install
	$(JUDGED_SPLITS) --seeds $(JUDGE3_SEEDS) --out $(JUDGE3_DATA)

keep-judge: judged-splits-3
	$(BIN)/python -m research eval --data $(JUDGE3_DATA) --task $(JUDGE_TASKS) --backbone $(TABLE_BACKBONE) \
		--methods retroprompt --seeds $(JUDGE3_SEEDS) --parallel $(PARALLEL) --keep best \
		--out docs/results/keep-judge-best-$(TABLE_BACKBONE)
	$(BIN)/python -m research eval --data $(JUDGE3_DATA) --task $(JUDGE_TASKS) --backbone $(TABLE_BACKBONE) \
		--methods retroprompt --seeds $(JUDGE3_SEEDS) --parallel $(PARALLEL) --keep last \
		--out docs/results/keep-judge-last-$(TABLE_BACKBONE)

# The store's layer after training (docs/decisions.md, "The store's layer after training": the rule,
# written before this grid ran): the default and the untrained task with the store keyed on the last layer
# and on layer 12, seeds 2016-2020 and a judge set of their own. A results directory holds one layer.
# Resumable; PARALLEL=N as above.
JUDGE4_DATA ?= openbook-data/judged-k-shot-4
JUDGE4_SEEDS = 2016,2017,2018,2019,2020
judged-splits-4: install
	$(JUDGED_SPLITS) --seeds $(JUDGE4_SEEDS) --out $(JUDGE4_DATA)

layer-judge: judged-splits-4
	$(BIN)/python -m research eval --data $(JUDGE4_DATA) --task $(JUDGE_TASKS) --backbone $(TABLE_BACKBONE) \
		--methods knn-interp,retroprompt --seeds $(JUDGE4_SEEDS) --parallel $(PARALLEL) --layer -1 \
		--out docs/results/layer-judge-last-$(TABLE_BACKBONE)
	$(BIN)/python -m research eval --data $(JUDGE4_DATA) --task $(JUDGE_TASKS) --backbone $(TABLE_BACKBONE) \
		--methods knn-interp,retroprompt --seeds $(JUDGE4_SEEDS) --parallel $(PARALLEL) --layer 12 \
		--out docs/results/layer-judge-12-$(TABLE_BACKBONE)

# Two readers of one book (docs/experiments/two-readers.md). The dev probes of the sentence reader's tuning
# and of mixing it with the untrained prompt (resumable, one record per run). Then the rule on the default,
# written before its grid: the default's training read with the slot store and with the reader's book, on
# seeds 2021-2025 and a judge set of their own; and the 16-shot table's run of the same on the standard
# seeds. Resumable; PARALLEL=N as above. On a GPU (the wheelhouse's `make install-offline` first), both
# grids in one go: make readers-judge table-16shot-readers PARALLEL=20 READERS_DEVICE=cuda.
READERS_DEVICE ?= cpu
JUDGE5_DATA ?= openbook-data/judged-k-shot-5
JUDGE5_SEEDS = 2021,2022,2023,2024,2025
two-readers-probe: setfit
	$(BIN)/python -m research two-readers --data $(OPENBOOK_DATA)/k-shot --out docs/results/two-readers-probe1-dev

# Probe 3 (more of the encoder within the job's budget): two processes, one thread each, sharing one
# resumable record file.
PROBE3 = $(BIN)/python -m research two-readers --data $(OPENBOOK_DATA)/k-shot --shots 16 \
	--variants t4:4:60:1e-4,t6:6:60:1e-4,t6s:6:120:5e-5 --out docs/results/two-readers-probe3-dev
two-readers-probe3: setfit
	$(PROBE3) --tasks SST-2,mpqa & first=$$!; $(PROBE3) --tasks sst-5,trec; second=$$?; wait $$first && exit $$second

# Probe 5 (the kept reader's tuning in bfloat16): PROBE5_VARIANT names probe 3's kept variant in bfloat16;
# two processes, as probe 3's float32 runs were, so that the tuning times compare.
PROBE5_VARIANT ?= t4b:4:60:1e-4:bfloat16
PROBE5 = $(BIN)/python -m research two-readers --data $(OPENBOOK_DATA)/k-shot --shots 16 \
	--variants $(PROBE5_VARIANT) --out docs/results/two-readers-probe3-dev
two-readers-probe5: setfit
	$(PROBE5) --tasks SST-2,mpqa & first=$$!; $(PROBE5) --tasks sst-5,trec; second=$$?; wait $$first && exit $$second

# Probe 6 (LoRA adapters over all 12 layers, a task's own 1.5 MB), only if probe 4 builds them.
PROBE6 = $(BIN)/python -m research two-readers --data $(OPENBOOK_DATA)/k-shot --shots 16 \
	--variants a12:12:60:5e-4:bfloat16:8,a12h:12:60:1e-3:bfloat16:8 --out docs/results/two-readers-probe3-dev
two-readers-probe6: setfit
	$(PROBE6) --tasks SST-2,mpqa & first=$$!; $(PROBE6) --tasks sst-5,trec; second=$$?; wait $$first && exit $$second

# Probe 7 (all 12 layers tuned in full, each run kept at rank 32 and cut to rank 8: a task's 6 or 1.5 MB).
PROBE7 = $(BIN)/python -m research two-readers --data $(OPENBOOK_DATA)/k-shot --shots 16 \
	--variants s12:12:60:2e-5:bfloat16:32:svd --out docs/results/two-readers-probe3-dev
two-readers-probe7: setfit
	$(PROBE7) --tasks SST-2,mpqa & first=$$!; $(PROBE7) --tasks sst-5,trec; second=$$?; wait $$first && exit $$second

# Probe 4 (all 12 layers, over a task's cap: whether adapters over all layers are worth building).
PROBE4 = $(BIN)/python -m research two-readers --data $(OPENBOOK_DATA)/k-shot --shots 16 \
	--variants t12:12:60:2e-5 --out docs/results/two-readers-probe4-dev
two-readers-probe4: setfit
	$(PROBE4) --tasks SST-2,mpqa & first=$$!; $(PROBE4) --tasks sst-5,trec; second=$$?; wait $$first && exit $$second

judged-splits-5: install
	$(JUDGED_SPLITS) --seeds $(JUDGE5_SEEDS) --out $(JUDGE5_DATA)

readers-judge: setfit judged-splits-5
	$(BIN)/python -m research eval --data $(JUDGE5_DATA) --task $(JUDGE_TASKS) --backbone $(TABLE_BACKBONE) \
		--methods retroprompt --reader mpnet --seeds $(JUDGE5_SEEDS) --parallel $(PARALLEL) --device $(READERS_DEVICE) \
		--out docs/results/readers-judge-$(TABLE_BACKBONE)

# The judge grid again, each run keeping its readings' distributions (distributions/): the default's rule
# with the reader probe 3 keeps, and the rule on how the readers combine (two-readers --combine).
readers-judge-2: setfit judged-splits-5
	$(BIN)/python -m research eval --data $(JUDGE5_DATA) --task $(JUDGE_TASKS) --backbone $(TABLE_BACKBONE) \
		--methods retroprompt --reader mpnet --keep-distributions --seeds $(JUDGE5_SEEDS) --parallel $(PARALLEL) \
		--device $(READERS_DEVICE) --out docs/results/readers-judge-2-$(TABLE_BACKBONE)

# Probe 8 (docs/experiments/two-readers.md, "Probe 8"): the judge grid again with probe 7's s12 as the
# reader's tuning, beside readers-judge-2's top 4 layers on the same splits.
READER_S12 = top_layers=12,adapters=32,adapters_from=svd,lr=2e-5
readers-judge-s12: setfit judged-splits-5
	$(BIN)/python -m research eval --data $(JUDGE5_DATA) --task $(JUDGE_TASKS) --backbone $(TABLE_BACKBONE) \
		--methods retroprompt --reader mpnet --reader-tuning $(READER_S12) --keep-distributions --seeds $(JUDGE5_SEEDS) \
		--parallel $(PARALLEL) --device $(READERS_DEVICE) --out docs/results/readers-judge-s12-$(TABLE_BACKBONE)

# The 16-shot table's two readers' rows (each record's readings: the prompt alone, the reader's book alone,
# both, and the slot store's), keeping the distributions so that the combination the judge picks is read
# on these same runs (two-readers --combine) without training again. The reader tuned as a job tunes it
# since probe 8 (all 12 layers at these sizes); the grids above and the first run of this table,
# docs/results/16shot-readers-$(TABLE_BACKBONE), tuned the top 4 layers at every size (to run them so again:
# --reader-tuning few_examples=0, into another --out).
table-16shot-readers: setfit
	$(BIN)/python -m research eval --data $(OPENBOOK_DATA)/k-shot --task SST-2,trec,mpqa,sst-5 --backbone $(TABLE_BACKBONE) \
		--methods retroprompt --reader mpnet --keep-distributions --seeds 13,21,42,87,100 --parallel $(PARALLEL) --device $(READERS_DEVICE) \
		--out docs/results/16shot-readers-2-$(TABLE_BACKBONE)

# clinc150's untrained task with the reader: the untrained methods read the frozen encoder's book, each
# record keeping the same method read with the slot store (its params' `slot`). The service's label
# scoring (label vectors above 16 labels), 5 seeds; resumable seed by seed.
clinc150-readers: setfit
	$(BIN)/python -m research eval --data $(OPENBOOK_DATA)/k-shot --task clinc150 --shots 10 --backbone $(TABLE_BACKBONE) \
		--methods zero-shot,knn,knn-interp --reader mpnet --seeds 13,21,42,87,100 --parallel $(PARALLEL) \
		--out docs/results/clinc150-readers-untrained-$(TABLE_BACKBONE)

# The judge of refusal (docs/experiments/two-readers.md, "Refusing out-of-scope queries by the reader's
# neighbours"): 30 of clinc150's intents held out as its out-of-scope queries, a judge of 20 examples of
# each other intent, new seeds drawn from the rest; the real test files are never read.
REFUSAL_JUDGE_DATA ?= openbook-data/clinc150-held-out
REFUSAL_JUDGE_SEEDS = 3001,3002,3003,3004,3005
refusal-judge-splits: install
	$(BIN)/python -m research held-out-intents --data $(OPENBOOK_DATA) --seeds $(REFUSAL_JUDGE_SEEDS) \
		--hold-out 30 --judge 20 --out $(REFUSAL_JUDGE_DATA)

# The judge grid itself: the trained two readers on the 120 kept intents, each record reading every
# refusal score (params.refusals); read by `python -m research two-readers --refusal DIR`.
refusal-judge: setfit refusal-judge-splits
	$(BIN)/python -m research eval --data $(REFUSAL_JUDGE_DATA) --task clinc150 --shots 10 --backbone $(TABLE_BACKBONE) \
		--label-scoring vectors --methods retroprompt --reader mpnet --seeds $(REFUSAL_JUDGE_SEEDS) --parallel $(PARALLEL) \
		--device $(READERS_DEVICE) --out docs/results/refusal-judge-$(TABLE_BACKBONE)

# Seed 13 of the trained two readers again, its record keeping every refusal score (params.refusals: the
# first run of that seed predates them), read once after the refusal judge chose `nearest`.
clinc150-readers-refusals-s13: setfit
	$(BIN)/python -m research eval --data $(OPENBOOK_DATA)/k-shot --task clinc150 --shots 10 --backbone $(TABLE_BACKBONE) \
		--label-scoring vectors --methods retroprompt --reader mpnet --seeds 13 --parallel 1 \
		--device $(READERS_DEVICE) --out docs/results/clinc150-readers-refusals-s13-$(TABLE_BACKBONE)

# clinc150 as the service serves it (`python -m research served`): each seed's 1,500 examples fitted as a
# job fits them (a quarter held out by hash, the reader tuned again on all 1,500, the refusal threshold
# chosen before that), read on the 4,500 in-scope test queries and the 1,000 out-of-scope ones;
# resumable seed by seed.
clinc150-served: setfit
	$(BIN)/python -m research served --data $(OPENBOOK_DATA)/k-shot --task clinc150 --shots 10 \
		--seeds 13,21,42,87,100 --backbone $(TABLE_BACKBONE) --device $(READERS_DEVICE) \
		--out docs/results/clinc150-served-$(TABLE_BACKBONE)

# clinc150's trained two readers: the default's training read with the reader's book and the slot store
# (each record's readings and slot_readings), label vectors as the service scores 150 labels; 5 seeds,
# resumable seed by seed.
clinc150-readers-trained: setfit
	$(BIN)/python -m research eval --data $(OPENBOOK_DATA)/k-shot --task clinc150 --shots 10 --backbone $(TABLE_BACKBONE) \
		--label-scoring vectors --methods retroprompt --reader mpnet --seeds 13,21,42,87,100 --parallel $(PARALLEL) \
		--device $(READERS_DEVICE) --out docs/results/clinc150-readers-trained-$(TABLE_BACKBONE)

# clinc150: 150 intents, 10 examples per intent (--shots 10), the 4,500 in-scope test queries and the
# 1,000 out-of-scope ones (scored for refusal only: docs/cli.md, "Data layout"). The untrained methods,
# 5 seeds; each seed's records land as it ends, so the grid resumes seed by seed. This table and the
# trained one below score the 150 words exactly, as the default did when they ran (label vectors are the
# default above 16 labels since: docs/decisions.md, "Many labels").
CLINC_SEEDS = 13,21,42,87,100
clinc150: install
	$(BIN)/python -m research eval $(KEPT_BEST) --data $(OPENBOOK_DATA)/k-shot --task clinc150 --shots 10 --backbone $(TABLE_BACKBONE) \
		--label-scoring exact --methods zero-shot,knn,knn-interp --seeds $(CLINC_SEEDS) --parallel $(PARALLEL) \
		--out docs/results/clinc150-untrained-$(TABLE_BACKBONE)

# clinc150's trained rows: prompt-ft, the default as it then was (retroprompt/demos=neural) and the SetFit-MPNet peer (its steps capped at
# SetFitConfig.max_steps, 1,000: 1,500 examples make 7,500 steps of pairs), 5 seeds of 1,500 examples, scored
# as the untrained rows are. Resumable, a unit per (method, seed); PARALLEL=N as above (on a GPU, all 15 at
# once: PARALLEL=15).
clinc150-trained: setfit
	$(BIN)/python -m research eval $(KEPT_BEST) --data $(OPENBOOK_DATA)/k-shot --task clinc150 --shots 10 --backbone $(TABLE_BACKBONE) \
		--label-scoring exact --methods prompt-ft,retroprompt/demos=neural,setfit --seeds $(CLINC_SEEDS) --parallel $(PARALLEL) \
		--out docs/results/clinc150-trained-$(TABLE_BACKBONE)

# The scoring rule's other side (docs/decisions.md, "Many labels"): label vectors on clinc150's dev sets,
# untrained, 5 seeds; test is never read.
clinc150-scoring-dev: install
	$(BIN)/python -m research eval $(KEPT_BEST) --no-test --data $(OPENBOOK_DATA)/k-shot --task clinc150 --shots 10 \
		--backbone $(TABLE_BACKBONE) --label-scoring vectors --methods zero-shot,knn,knn-interp \
		--seeds $(CLINC_SEEDS) --parallel $(PARALLEL) --out docs/results/clinc150-vectors-dev-$(TABLE_BACKBONE)

# The rule's second part: the trained default as it then was (retroprompt/demos=neural) with label vectors on
# the same dev sets, test never read; its exact side is clinc150-trained's rows of it. Resumable, a unit per seed.
clinc150-vectors-trained-dev: install
	$(BIN)/python -m research eval $(KEPT_BEST) --no-test --data $(OPENBOOK_DATA)/k-shot --task clinc150 --shots 10 \
		--backbone $(TABLE_BACKBONE) --label-scoring vectors --methods retroprompt/demos=neural \
		--seeds $(CLINC_SEEDS) --parallel $(PARALLEL) \
		--out docs/results/clinc150-vectors-trained-dev-$(TABLE_BACKBONE)

# The default's clinc150 row since the rule's second part decided (docs/decisions.md, "Many labels"): the
# trained retroprompt/demos=neural (the default then) with label vectors, test read; clinc150-trained's rows
# of it are exact scoring. Beside it, today's default (retroprompt, no demonstrations), the same way.
clinc150-vectors-trained: install
	$(BIN)/python -m research eval $(KEPT_BEST) --data $(OPENBOOK_DATA)/k-shot --task clinc150 --shots 10 \
		--backbone $(TABLE_BACKBONE) --label-scoring vectors --methods retroprompt/demos=neural,retroprompt \
		--seeds $(CLINC_SEEDS) --parallel $(PARALLEL) \
		--out docs/results/clinc150-vectors-trained-$(TABLE_BACKBONE)

# The trained default's objective at 150 labels (docs/decisions.md: the rule, written before this ran): the
# default then (neural demonstrations) beside two contrastive candidates, label vectors, dev only (test never read). On one GPU the 15
# units fit at once (PARALLEL=15); resumable, a unit per (method, seed).
CLINC_OBJECTIVES = retroprompt/demos=neural,retroprompt/demos=neural/contrastive=1.0,retroprompt/contrastive=1.0
clinc150-objective-dev: install
	$(BIN)/python -m research eval $(KEPT_BEST) --no-test --data $(OPENBOOK_DATA)/k-shot --task clinc150 --shots 10 \
		--backbone $(TABLE_BACKBONE) --label-scoring vectors --methods $(CLINC_OBJECTIVES) \
		--seeds $(CLINC_SEEDS) --parallel $(PARALLEL) \
		--out docs/results/clinc150-objective-dev-$(TABLE_BACKBONE)

# The budget at 1,500 examples (docs/decisions.md: the rule, written before this ran): the default then with
# label vectors, dev only, its cap raised so that it never cuts the first 2 (376 steps) or 3 (564) passes
# over clinc150's 1,500 training examples; against clinc150-objective-dev's retroprompt/demos=neural records.
CLINC_BUDGET_CAPS = 376 564
clinc150-budget-dev: install
	for cap in $(CLINC_BUDGET_CAPS); do \
		$(BIN)/python -m research eval $(KEPT_BEST) --no-test --data $(OPENBOOK_DATA)/k-shot --task clinc150 --shots 10 \
			--backbone $(TABLE_BACKBONE) --label-scoring vectors --methods retroprompt/demos=neural --max-steps $$cap \
			--seeds $(CLINC_SEEDS) --parallel $(PARALLEL) \
			--out docs/results/clinc150-budget-dev-$$cap-$(TABLE_BACKBONE) || exit 1; \
	done

# Mixed precision in training, judged on dev (docs/decisions.md, "Mixed precision in training": the rule,
# written before these ran), on the default as it then was (neural demonstrations). The float32 sides are the 16-shot table's and clinc150-vectors-trained-dev's
# records; these are the bfloat16 sides. Test is never read.
PRECISION_SEEDS = 13,21,42
precision-dev: install
	$(BIN)/python -m research eval $(KEPT_BEST) --no-test --data $(OPENBOOK_DATA)/k-shot --task trec,sst-5 --backbone $(TABLE_BACKBONE) \
		--methods retroprompt/demos=neural --seeds $(PRECISION_SEEDS) --train-precision bfloat16 --parallel $(PARALLEL) \
		--out docs/results/precision-dev-$(TABLE_BACKBONE)
precision-dev-clinc150: install
	$(BIN)/python -m research eval $(KEPT_BEST) --no-test --data $(OPENBOOK_DATA)/k-shot --task clinc150 --shots 10 \
		--backbone $(TABLE_BACKBONE) --label-scoring vectors --methods retroprompt/demos=neural --seeds $(PRECISION_SEEDS) \
		--train-precision bfloat16 --parallel $(PARALLEL) \
		--out docs/results/precision-dev-clinc150-vectors-$(TABLE_BACKBONE)

# IPT's pretrained prompt table (ipt/strategy=pretrained), built once into the model cache from the
# full training sets under $(OPENBOOK_DATA) (a few CPU minutes).
ipt-table: install
	$(BIN)/python -m research ipt-table --data $(OPENBOOK_DATA) --method ipt/strategy=pretrained

bench: install
	$(BIN)/python -m research bench store
	$(BIN)/python -m research bench train

# The dev-only grid that chose how the store scores its neighbours (docs/knn-selection.md, "How the store
# scores its neighbours"): knn and knn-interp under each candidate scoring, 4 tasks x 5 seeds, dev only.
.PHONY: knn-dev
KNN_CANDIDATES = cosine:--knn-similarity=cosine:--no-knn-standardise:--knn-temperature=0.1 \
	centred:--knn-similarity=centred:--no-knn-standardise:--knn-temperature=0.1 \
	standardised:--knn-similarity=cosine:--knn-standardise:--knn-temperature=1 \
	centred-standardised:--knn-similarity=centred:--knn-standardise:--knn-temperature=1
knn-dev: install
	for candidate in $(KNN_CANDIDATES); do \
		set -- $$(echo $$candidate | tr ':' ' '); name=$$1; shift; \
		$(BIN)/python -m research eval $(KEPT_BEST) --no-test --data $(OPENBOOK_DATA)/k-shot --task $(DEV_TASKS) --backbone $(DEV_BACKBONE) \
			--methods knn,knn-interp --seeds 13,21,42,87,100 "$$@" --parallel $(PARALLEL) \
			--out docs/results/knn-dev-$(DEV_BACKBONE)-$$name \
			|| exit 1; \
	done
