# The R side of tests/test_r_client.py: a training loop's data side, as an R torch user writes it.
#   Rscript tests/r_loop.R CONNECTION OUT EPOCHS [resume] [drop-after-N] [step-S]
# Each batch: its arrays appended to OUT/x.bin and OUT/y.bin as R holds them (column-major doubles), a line
# "epoch batch n_x n_y dims" in OUT/log, then the state after it in OUT/state (renamed into place: whole or absent).
# Epoch 0 runs with while/ferry_next, later ones with for/ferry_epoch. "resume": start from OUT/state.
# "drop-after-N": after N batches, cut the connection without a word and reconnect (ferry_reconnect).
# "step-S": a model step of S seconds after each batch.
args <- commandArgs(trailingOnly = TRUE)
here <- dirname(normalizePath(sub("^--file=", "", grep("^--file=", commandArgs(FALSE), value = TRUE))))
source(file.path(here, "..", "clients", "r", "R", "ferry.R"))
connection <- args[1]
out <- args[2]
epochs <- as.integer(args[3])
resume <- "resume" %in% args
drop_after <- if (any(startsWith(args, "drop-after-"))) as.integer(sub("drop-after-", "", grep("^drop-after-", args,
                                                                                                   value = TRUE))) else -1L
step <- if (any(startsWith(args, "step-"))) as.numeric(sub("step-", "", grep("^step-", args, value = TRUE))) else 0
loader <- ferry_loader(connection, window = 2L)
first <- 0L
k <- 0L
if (resume) {
  state <- paste(readLines(file.path(out, "state")), collapse = "\n")
  ferry_load_state_dict(loader, state)
  first <- as.integer(sub('.*"epoch": ([0-9]+).*', "\\1", state))
  k <- as.integer(sub('.*"batches_delivered": ([0-9]+).*', "\\1", state))
}
x_out <- file(file.path(out, "x.bin"), "ab")
y_out <- file(file.path(out, "y.bin"), "ab")
taken <- 0L
record <- function(epoch, batch) {
  x <- batch[[1]]
  y <- batch[[2]]
  writeBin(as.double(x), x_out)
  writeBin(as.double(y), y_out)
  flush(x_out)
  flush(y_out)
  cat(epoch, k, length(x), length(y), paste(dim(x), collapse = ","), "\n", file = file.path(out, "log"),
      append = TRUE)
  k <<- k + 1L
  state <- ferry_state_dict(loader)
  writeLines(unclass(state), file.path(out, "state.tmp"))
  file.rename(file.path(out, "state.tmp"), file.path(out, "state"))
  taken <<- taken + 1L
  Sys.sleep(step)
  if (taken == drop_after) {
    close(loader$con)  # the connection breaks; this loop keeps its place
    loader$con <- NULL
    ferry_reconnect(loader)
  }
}
for (epoch in first:(epochs - 1L)) {
  ferry_set_epoch(loader, epoch)  # after a resume too: the epoch the state names keeps its position
  if (epoch == 0L) {
    while (!is.null(batch <- ferry_next(loader))) record(epoch, batch)
  } else {
    for (batch in ferry_epoch(loader)) record(epoch, batch)
  }
  k <- 0L
}
cat(ferry_stats(loader), file = file.path(out, "stats.json"))
ferry_close(loader)
cat("done\n")
