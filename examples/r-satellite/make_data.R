# The seed's data, made as the seed's own R script makes it: each sample a numeric vector of 13*299*299 whole
# numbers 0..255 (floor(runif(...))) saved with saveRDS (gzip, R's default) in class folders 0/ and 1/, the files
# named .png although they are RDS files.
#   Rscript examples/r-satellite/make_data.R ROOT [PER_CLASS] [SIDE]     (SIDE 299: full size; smaller for tests)
args <- commandArgs(trailingOnly = TRUE)
root <- args[1]
per_class <- if (length(args) >= 2) as.integer(args[2]) else 64L
side <- if (length(args) >= 3) as.integer(args[3]) else 299L
set.seed(34)
for (class in c("0", "1")) {
  dir.create(file.path(root, class), recursive = TRUE, showWarnings = FALSE)
  for (i in seq_len(per_class)) {
    saveRDS(floor(runif(13 * side * side, 0, 256)), file.path(root, class, sprintf("tile_%05d.png", i)))
  }
}
cat(sprintf("%d files of 13x%dx%d in %s\n", 2L * per_class, side, side, root))
