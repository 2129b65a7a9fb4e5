# The seed's training loop, ported: 2 epochs over the same files, loaded two ways, epoch by epoch in turn:
#   readRDS: R's own sequential loading (what R torch's dataloader does, and what num_workers was to speed up);
#   ferry:   batches from `ferry relay`, whose local producers read the files in parallel (rds-folder).
# Each batch prints its load wait, as the seed's script does; a model step stands in for the GPU's (R waits for
# the GPU without using a CPU, so Sys.sleep is what a GPU step costs the loader).
#   Rscript examples/r-satellite/train.R ROOT [BATCH] [PRODUCERS] [STEP_S] [DTYPE] [SLOTS]
# SLOTS: batches each producer builds at once (1: the first batch of an epoch comes after one batch's work, as
# readRDS's does, instead of after several built side by side; the epoch takes as long either way on busy cores)
args <- commandArgs(trailingOnly = TRUE)
here <- dirname(normalizePath(sub("^--file=", "", grep("^--file=", commandArgs(FALSE), value = TRUE))))
source(file.path(here, "..", "..", "clients", "r", "R", "ferry.R"))
root <- normalizePath(args[1])
batch_size <- if (length(args) >= 2) as.integer(args[2]) else 32L
producers <- if (length(args) >= 3) as.integer(args[3]) else 2L
step_s <- if (length(args) >= 4) as.numeric(args[4]) else 0.05
dtype <- if (length(args) >= 5) args[5] else "float64"
slots <- if (length(args) >= 6) as.integer(args[6]) else 1L
files <- unlist(lapply(c("0", "1"), function(class) sort(list.files(file.path(root, class), full.names = TRUE))))
labels <- rep(0:1, each = length(files) / 2)
side <- as.integer(round(sqrt(length(readRDS(files[1])) / 13)))
shape <- c(13L, side, side)

model_step <- function(x, y) Sys.sleep(step_s)  # torch: loss <- nnf_binary_cross_entropy(model(x), y); ...

# R's own loading: the samples of a batch read one after another, as R torch's dataloader does without workers
readrds_epoch <- function(epoch) {
  set.seed(epoch)
  order <- sample(length(files))
  waits <- c()
  for (start in seq(1, length(order) - batch_size + 1, by = batch_size)) {
    began <- Sys.time()
    at <- order[start:(start + batch_size - 1)]
    x <- array(0, dim = c(batch_size, shape))
    for (i in seq_along(at)) x[i, , , ] <- array(readRDS(files[at[i]]), dim = shape)
    y <- labels[at]
    waits <- c(waits, as.numeric(Sys.time() - began, units = "secs"))
    cat(sprintf("readRDS epoch %d batch %d: load wait %.3f s\n", epoch, length(waits), waits[length(waits)]))
    model_step(x, y)
  }
  waits
}

connection <- ferry_start_relay(c(
  "--dataset", "rds-folder", "--dataset-arg", paste0("root=", root),
  "--dataset-arg", paste0("shape=", paste(shape, collapse = ",")), "--dataset-arg", paste0("dtype=", dtype),
  "--local-producers", producers, "--option", paste0("producer_slots=", slots), "--batch-size", batch_size,
  "--shuffle", "--drop-last",
  "--option", "log_every=null"))
loader <- ferry_loader(connection)

ferry_epoch_waits <- function(epoch) {
  ferry_set_epoch(loader, epoch)
  waits <- c()
  repeat {
    began <- Sys.time()
    batch <- ferry_next(loader)             # torch: x <- torch_tensor(batch[[1]], dtype = torch_float())
    if (is.null(batch)) break
    waits <- c(waits, as.numeric(Sys.time() - began, units = "secs"))
    cat(sprintf("ferry   epoch %d batch %d: load wait %.3f s\n", epoch, length(waits), waits[length(waits)]))
    stopifnot(identical(dim(batch[[1]]), c(batch_size, shape)))
    model_step(batch[[1]], batch[[2]])
  }
  waits
}

readrds <- list()
ferry <- list()
for (epoch in 0:1) {  # in turn, so that both see the same machine
  readrds[[epoch + 1]] <- readrds_epoch(epoch)
  ferry[[epoch + 1]] <- ferry_epoch_waits(epoch)
}
ferry_close(loader, stop_relay = TRUE)
for (epoch in 0:1) {  # epoch 0's first Ferry batch includes the producers' start
  r <- readrds[[epoch + 1]]
  f <- ferry[[epoch + 1]]
  cat(sprintf("epoch %d: mean load wait per batch: readRDS %.3f s, ferry %.3f s: %.1fx less\n", epoch, mean(r),
              mean(f), mean(r) / mean(f)))
}
r <- unlist(readrds)
f <- unlist(ferry)
cat(sprintf("mean load wait per batch: readRDS %.3f s, ferry %.3f s (%d producers, batch %d, %s): %.1fx less\n",
            mean(r), mean(f), producers, batch_size, dtype, mean(r) / mean(f)))
cat(sprintf("median: readRDS %.3f s, ferry %.3f s\n", median(r), median(f)))
