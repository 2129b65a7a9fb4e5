# The R client's own tests, without a relay: the header, the arrays' order and dtypes, a batch's nesting, errors as
# conditions. Run: Rscript clients/r/tests/run.R (tests/test_r_client.py runs it). Prints "N passed, N failed".

args <- commandArgs(trailingOnly = FALSE)
here <- dirname(normalizePath(sub("^--file=", "", args[grep("^--file=", args)])))
source(file.path(here, "..", "R", "ferry.R"))

passed <- 0L
failed <- 0L
check <- function(what, ok) {
  if (isTRUE(ok)) {
    passed <<- passed + 1L
  } else {
    failed <<- failed + 1L
    cat("FAILED:", what, "\n")
  }
}

# a header: its type, fields, parts in order (arrays with dims, a scalar's "-", texts and nulls)
h <- .ferry_parse_header(paste("batch", "pass 3", "item 0", "order F", "array #0 float64 2,3,4",
                               "array #1 int32 2", "array s%2Fx bool -", "text name 5", "null #2", "empty ",
                               sep = "\n"))
check("type", h$type == "batch")
check("fields", identical(h$fields$pass, "3") && identical(h$fields$order, "F") && identical(h$fields$empty, ""))
check("parts", length(h$parts) == 5L && identical(h$parts[[1]]$dims, c(2L, 3L, 4L)) &&
        identical(h$parts[[3]]$dims, integer(0)) && h$parts[[4]]$nbytes == 5L && h$parts[[5]]$kind == "null")

# an array's bytes, column-major: R's a[i, j, k] is the batch's [i - 1, j - 1, k - 1]; the relay sends the bytes of
# numpy's a.T, which here are 0..23 for an array whose [i, j, k] (0-based) holds i * 100 + j * 10 + k
dims <- c(2L, 3L, 4L)
values <- as.vector(outer(outer(0:1 * 100, 0:2 * 10, "+"), 0:3, "+"))  # R's own column-major order of that array
con <- rawConnection(writeBin(as.double(values), raw(), size = 8L, endian = "little"))
a <- .ferry_read_array(con, list(name = "x", dtype = "float64", dims = dims))
close(con)
check("dims", identical(dim(a), dims))
check("[i, j, k] is [i - 1, j - 1, k - 1]", a[2, 3, 4] == 123 && a[1, 2, 3] == 12 && a[2, 1, 1] == 100)

# every dtype R reads: float64 and int32 natively, uint8 and bool as raw; the relay never sends others to R, but
# what it could (float32, int16, uint16) reads right too
read <- function(bytes, dtype, dims) {
  con <- rawConnection(bytes)
  on.exit(close(con))
  .ferry_read_array(con, list(name = "x", dtype = dtype, dims = dims))
}
check("int32", identical(read(writeBin(c(-5L, 7L), raw(), size = 4L, endian = "little"), "int32", 2L), c(-5L, 7L)))
check("uint8", identical(read(as.raw(c(0, 200, 255)), "uint8", 3L), c(0L, 200L, 255L)))
check("bool", identical(read(as.raw(c(0, 1, 1, 0)), "bool", c(2L, 2L)), matrix(c(FALSE, TRUE, TRUE, FALSE), 2)))
check("float32", identical(read(writeBin(c(0.5, -2), raw(), size = 4L, endian = "little"), "float32", 2L),
                           c(0.5, -2)))
check("int16", identical(read(writeBin(c(-3L, 300L), raw(), size = 2L, endian = "little"), "int16", 2L),
                         c(-3L, 300L)))
check("uint16", identical(read(writeBin(c(65535L, 1L), raw(), size = 2L, endian = "little"), "uint16", 2L),
                          c(65535L, 1L)))
check("a scalar", identical(read(writeBin(3.5, raw(), size = 8L, endian = "little"), "float64", integer(0)), 3.5))
check("a short array stops", inherits(tryCatch(read(as.raw(1:3), "int32", 2L), error = identity),
                                      "ferry_connection_lost"))

# a batch's parts nest as the Python batch: a tuple is an unnamed list, a dict a named one (keys decoded)
nested <- .ferry_nest(list(c("#0"), c("#1", "a%2Fb"), c("#1", "c"), c("#2", "#1"), c("#2", "#0")),
                      list("x", 1, 2, "second", "first"))
check("positions", is.null(names(nested)) && length(nested) == 3L && nested[[1]] == "x")
check("keys", identical(names(nested[[2]]), c("a/b", "c")) && nested[[2]][["a/b"]] == 1)
check("order of positions", identical(nested[[3]], list("first", "second")))
check("one array", identical(.ferry_nest(list(character(0)), list(42)), 42))

# an error: an R condition of the Python classes, with the remote traceback
e <- .ferry_error(list(fields = list(class = "KeyError", classes = "KeyError,RemoteSampleError,FerryError",
                                     index = "7", consumed = "1"),
                       texts = list(message = "sample 7 failed", traceback = "Traceback: ...")))
check("condition classes", inherits(e, "ferry_KeyError") && inherits(e, "ferry_RemoteSampleError") &&
        inherits(e, "error"))
check("condition fields", e$index == 7L && e$consumed && e$traceback == "Traceback: ..." &&
        grepl("KeyError: sample 7", conditionMessage(e)))
caught <- tryCatch(stop(e), ferry_RemoteSampleError = function(c) "caught")
check("tryCatch by class", identical(caught, "caught"))

# a message as the relay frames it, read back through a connection
framed <- local({
  header <- charToRaw("state\nreply state\ntext state 9")
  c(writeBin(length(header), raw(), size = 4L, endian = "big"), header, charToRaw("{\"a\": 1}\n"))
})
fake <- new.env()
fake$con <- rawConnection(framed)
m <- .ferry_read(fake)
close(fake$con)
check("a framed message", m$type == "state" && identical(m$texts$state, "{\"a\": 1}\n"))

# the connection file
path <- tempfile()
writeLines(c("ferry-relay", "version 1", "host 127.0.0.1", "port 5000", "token abc", "payload /dev/shm/x"), path)
info <- .ferry_read_connection_file(path)
check("connection file", info$port == "5000" && info$token == "abc" && info$payload == "/dev/shm/x")
unlink(path)

# the relay's process gets the LD_LIBRARY_PATH the user had before R's launcher put R's folders first (a Python
# started with them can load another libpython and find none of its packages)
r_lib <- R.home("lib")
check("R's folders dropped", .ferry_library_path_without_r(paste(r_lib, "/usr/lib/x86_64-linux-gnu",
                                                                 "/usr/lib/jvm/default-java/lib/server",
                                                                 "/opt/cuda/lib64", sep = ":")) == "/opt/cuda/lib64")
check("only R's", .ferry_library_path_without_r(paste(r_lib, "/usr/lib/x86_64-linux-gnu", sep = ":")) == "")
check("a path R did not make is kept", .ferry_library_path_without_r("/opt/a:/usr/lib/x86_64-linux-gnu") ==
        "/opt/a:/usr/lib/x86_64-linux-gnu")

cat(sprintf("%d passed, %d failed\n", passed, failed))
quit(status = if (failed == 0L) 0L else 1L)
