# Ferry's R client: batches from a `ferry relay` (a RemoteLoader in a Python process of its own) in an R loop.
# Base R only (socketConnection, readBin, writeBin). The protocol: docs/relay-protocol.md (version 1).
#
#   source("clients/r/R/ferry.R")                      # or: R CMD INSTALL clients/r; library(ferry)
#   loader <- ferry_loader("/tmp/relay.conn")          # the relay's connection file (ferry relay --connection-file)
#   for (epoch in 0:1) {
#     ferry_set_epoch(loader, epoch)
#     while (!is.null(batch <- ferry_next(loader))) {  # a pass over the epoch; NULL at its end
#       x <- batch[[1]]                                # an R array: dim(x) == c(32, 13, 299, 299)
#       y <- batch[[2]]                                # an integer vector of labels
#     }
#   }
#   for (batch in ferry_epoch(loader)) x <- batch[[1]] # the same, with for (see ferry_epoch)
#   coro::loop(for (batch in loader) ...)              # with coro installed
#   state <- ferry_state_dict(loader)                  # a JSON string: save it, resume with ferry_load_state_dict
#   ferry_close(loader)
#
# Arrays come in the shape Python's batch has, indexed alike: element [i, j, k, l] of an R array is element
# [i - 1, j - 1, k - 1, l - 1] of the batch's tensor (the relay sends them column-major, R's order, so no transpose
# is needed here). torch_tensor(batch[[1]]) is that tensor, same shape, same elements.

.FERRY_VERSION <- 1L
# what R reads at memory speed; the relay converts any other dtype to one of these (float32 -> float64, int64 ->
# int32 when every value fits, ...)
.FERRY_DTYPES <- "float64,int32,uint8,bool"

#' Connect to a relay.
#'
#' @param connection the relay's connection file (`ferry relay --connection-file`): its port, token and payload
#'   folder. Or give `port` and `token`.
#' @param window items the relay sends ahead of what this loop consumed (at most the loader's buffer_batches).
#' @param payload "auto" (arrays read from the relay's payload files when it offers them: R reads files 5 times
#'   faster than sockets), "file" or "inline" (every byte over the socket).
#' @param timeout seconds one read may wait; the relay pings every 5 s, so a longer silence means it is gone.
#' @return a `ferry_loader` (an environment).
ferry_loader <- function(connection = NULL, port = NULL, token = "", host = "127.0.0.1", window = 2L,
                         payload = c("auto", "file", "inline"), timeout = 60, .version = .FERRY_VERSION) {
  payload <- match.arg(payload)
  loader <- new.env(parent = emptyenv())
  loader$connection <- connection
  loader$host <- host
  loader$port <- port
  loader$token <- token
  loader$window <- as.integer(window)
  loader$payload <- payload
  loader$timeout <- timeout
  loader$version <- .version
  loader$queue <- list()        # items that arrived while a command waited for its reply
  loader$pass <- 0L             # the pass this loop is in (0: none)
  loader$consumed <- 0L         # items of it consumed
  loader$active <- FALSE        # a pass is in progress
  loader$con <- NULL
  class(loader) <- "ferry_loader"
  .ferry_connect(loader, resume = FALSE)
  loader
}

.ferry_connect <- function(loader, resume) {
  if (!is.null(loader$connection)) {
    info <- .ferry_read_connection_file(loader$connection)
    loader$host <- if (is.null(info$host)) loader$host else info$host
    loader$port <- as.integer(info$port)
    loader$token <- info$token
    loader$folder_offered <- !is.null(info$payload)
  } else {
    loader$folder_offered <- TRUE
  }
  if (is.null(loader$port)) stop("ferry_loader: give the relay's connection file, or its port and token")
  loader$con <- socketConnection(loader$host, loader$port, blocking = TRUE, open = "r+b", timeout = loader$timeout)
  fields <- list(version = loader$version, token = loader$token, order = "F", dtypes = .FERRY_DTYPES,
                 window = loader$window, client = sprintf("R %s.%s (pid %d)", R.version$major, R.version$minor,
                                                          Sys.getpid()),
                 payload = if (loader$payload == "inline" || !loader$folder_offered) "inline" else "file")
  if (resume && loader$pass > 0L) fields <- c(fields, list(pass = loader$pass, consumed = loader$consumed))
  .ferry_send(loader, "hello", fields)
  reply <- .ferry_read(loader)
  if (reply$type == "refuse") {
    close(loader$con)
    loader$con <- NULL
    stop(.ferry_condition(paste0("the relay refused this client: ", reply$texts$reason),
                          c("refused", "RelayError")))
  }
  if (reply$type != "welcome") stop("ferry: the relay answered a hello with ", reply$type)
  f <- reply$fields
  loader$window <- as.integer(f$window)
  loader$folder <- f$folder
  loader$epoch <- as.integer(f$epoch)
  if (!resume || as.integer(f$pass) != loader$pass) {
    # a new client goes on where the relay's last one was: the items it had not consumed come again
    loader$pass <- as.integer(f$pass)
    loader$consumed <- as.integer(f$consumed)
    loader$active <- f$active == "1"
  }
  loader$queue <- list()
  invisible(loader)
}

#' Connect again (after the connection broke), going on where this loop was: the items it had not consumed
#' come again, none twice. The connection file is read again (a relay restarted on another port).
ferry_reconnect <- function(loader) {
  if (!is.null(loader$con)) try(close(loader$con), silent = TRUE)
  loader$con <- NULL
  .ferry_connect(loader, resume = TRUE)
}

#' The next batch of the current pass, starting a pass over the next epoch when none is active; NULL at the pass's
#' end (the next call starts the next epoch). A batch whose sample failed raises its error here, in its place (an
#' R condition of class c("ferry_RemoteSampleError", ..., "ferry_error", "error"), carrying the remote traceback).
ferry_next <- function(loader) {
  .ferry_open(loader)
  if (!loader$active) .ferry_start(loader)
  item <- .ferry_next_item(loader)
  # a batch's arrays are read before its credit goes back: the credit frees its payload file for the next batch
  batch <- if (item$type == "batch") .ferry_batch(loader, item) else NULL
  .ferry_consumed(loader)
  if (item$type == "end") {
    loader$active <- FALSE
    return(NULL)
  }
  if (item$type == "error") stop(.ferry_error(item))
  batch
}

#' A new pass over the next epoch (Python's `iter(loader)`), as a list that `for` walks: one element per batch,
#' each a handle that gets its batch from the relay the first time it is used (`batch[[1]]`, `batch$x`,
#' `names(batch)`, `as.list(batch)`), in order. R's `for` walks a list made before its first turn and calls
#' nothing between turns, so this list cannot hold the batches themselves (they would all be in memory at once):
#' a handle keeps its batch until the next handle is used. Needs the pass's length (a map-style dataset, or a
#' sharded one with shard lengths); otherwise use `while (!is.null(batch <- ferry_next(loader)))` or coro::loop.
ferry_epoch <- function(loader) {
  .ferry_open(loader)
  started <- .ferry_start(loader)
  n <- started$length
  if (n < 0L) {
    stop("ferry_epoch: the length of this pass is not known in advance (an iterable dataset, or a sharded one ",
         "without shard lengths): iterate with while (!is.null(batch <- ferry_next(loader))) or coro::loop")
  }
  pass <- new.env(parent = emptyenv())
  pass$loader <- loader
  pass$number <- loader$pass
  pass$taken <- 0L     # batches taken from the relay
  pass$current <- NULL  # the handle holding a batch
  lapply(seq_len(n), function(k) {
    handle <- new.env(parent = emptyenv())
    # its fields live in an environment of no class: `$` on the handle itself is the batch's
    assign("state", list2env(list(pass = pass, k = k, batch = NULL), parent = emptyenv()), envir = handle)
    class(handle) <- "ferry_batch"
    handle
  })
}

.ferry_handle_state <- function(handle) get("state", envir = handle, inherits = FALSE)

.ferry_handle_batch <- function(x) {
  handle <- .ferry_handle_state(x)
  if (!is.null(handle$batch)) return(handle$batch)
  pass <- handle$pass
  loader <- pass$loader
  if (loader$pass != pass$number) stop("ferry: this batch's pass was abandoned (a new pass started since)")
  if (handle$k <= pass$taken) {
    stop(sprintf("ferry: batch %d of this pass was let go when batch %d was used; keep what you need of it",
                 handle$k, pass$taken))
  }
  while (pass$taken < handle$k) {   # handles skipped by the loop body: their batches are passed over, in order
    batch <- ferry_next(loader)
    if (is.null(batch)) stop("ferry: the pass ended before batch ", handle$k)
    pass$taken <- pass$taken + 1L
  }
  if (!is.null(pass$current)) pass$current$batch <- NULL  # one batch held at a time
  handle$batch <- batch
  pass$current <- handle
  if (loader$active && handle$k == .ferry_pass_length(loader)) {  # the last: take the end too, as a for loop does
    end <- .ferry_next_item(loader)
    .ferry_consumed(loader)
    if (end$type == "end") loader$active <- FALSE else loader$queue <- c(list(end), loader$queue)
  }
  batch
}

`[[.ferry_batch` <- function(x, i, ...) .ferry_handle_batch(x)[[i]]
`$.ferry_batch` <- function(x, name) .ferry_handle_batch(x)[[name]]
names.ferry_batch <- function(x) names(.ferry_handle_batch(x))
length.ferry_batch <- function(x) length(.ferry_handle_batch(x))
as.list.ferry_batch <- function(x, ...) .ferry_handle_batch(x)
print.ferry_batch <- function(x, ...) {
  cat("<ferry batch ", .ferry_handle_state(x)$k, ">\n", sep = "")
  invisible(x)
}

#' coro's iterator protocol, for coro::loop(for (batch in loader) ...): a new pass over the next epoch.
as_iterator.ferry_loader <- function(x) {
  loader <- x
  exhausted <- as.symbol(".__exhausted__.")  # coro::exhausted()
  .ferry_start(loader)
  function() {
    batch <- ferry_next(loader)
    if (is.null(batch)) exhausted else batch
  }
}

#' Set the epoch of the next pass (DistributedSampler's set_epoch: its shuffle).
ferry_set_epoch <- function(loader, epoch) {
  .ferry_command(loader, "set_epoch", list(epoch = as.integer(epoch)))
  invisible(loader)
}

#' Where this loop is, as the loader's state_dict (a JSON string): after the batches it consumed, exactly. Save
#' it (writeLines) and give it to ferry_load_state_dict in a new R process to go on from there.
ferry_state_dict <- function(loader) {
  structure(.ferry_command(loader, "state")$texts$state, class = "ferry_state")
}

#' Resume from a state saved by ferry_state_dict: the next pass starts after its last batch.
ferry_load_state_dict <- function(loader, state) {
  .ferry_command(loader, "load_state", texts = list(state = paste(unclass(state), collapse = "\n")))
  loader$active <- FALSE
  invisible(loader)
}

print.ferry_state <- function(x, ...) {
  cat("<ferry state> ", unclass(x), "\n", sep = "")
  invisible(x)
}

#' The relay's figures and its loader's stats(), as a JSON string.
ferry_stats <- function(loader) .ferry_command(loader, "stats")$texts$stats

#' Close the connection (the relay keeps its place for the next client); stop_relay = TRUE also stops the relay.
ferry_close <- function(loader, stop_relay = FALSE) {
  if (!is.null(loader$con)) {
    try(.ferry_send(loader, "bye", list(stop = as.integer(stop_relay))), silent = TRUE)
    try(close(loader$con), silent = TRUE)
    loader$con <- NULL
  }
  invisible(NULL)
}

print.ferry_loader <- function(x, ...) {
  cat(sprintf("<ferry_loader %s:%s pass %d, %d consumed%s>\n", x$host, x$port, x$pass, x$consumed,
              if (is.null(x$con)) ", closed" else ""))
  invisible(x)
}

#' Start `ferry relay` in the background with `args` (a character vector of its flags) and wait for its connection
#' file; returns the file's path, for ferry_loader. The relay runs until ferry_close(loader, stop_relay = TRUE) or
#' a signal; it outlives this R process (a new one goes on where this one was).
ferry_start_relay <- function(args, connection = tempfile("ferry-relay-", fileext = ".conn"), command = "ferry",
                              log = tempfile("ferry-relay-", fileext = ".log"), timeout = 120) {
  status <- paste0(connection, ".exit")  # written by the shell when the relay exits: a start that fails says so now
  unlink(c(connection, status))
  line <- paste(c(shQuote(command), "relay", "--connection-file", shQuote(connection), vapply(args, shQuote, "")),
                collapse = " ")
  ld <- .ferry_library_path_without_r()
  if (!identical(ld, Sys.getenv("LD_LIBRARY_PATH"))) {  # Python, not R, must find its own libraries
    line <- paste0(if (nzchar(ld)) paste0("LD_LIBRARY_PATH=", shQuote(ld), " ") else "unset LD_LIBRARY_PATH; ", line)
  }
  system2("sh", c("-c", shQuote(sprintf("%s >%s 2>&1; echo $? >%s", line, shQuote(log), shQuote(status)))),
          wait = FALSE)
  deadline <- Sys.time() + timeout
  while (!file.exists(connection)) {
    if (file.exists(status) || Sys.time() > deadline) {
      stop("ferry_start_relay: ", if (file.exists(status)) "the relay exited" else
             paste("no connection file after", timeout, "s"), "; its output:\n",
           paste(if (file.exists(log)) readLines(log, warn = FALSE) else "", collapse = "\n"))
    }
    Sys.sleep(0.1)
  }
  connection
}

# R's launcher (R_HOME/etc/ldpaths) puts its own library folders in front of LD_LIBRARY_PATH: R_HOME/lib, the system's
# library folder and Java's. A Python started from R with them first can load another libpython than its own (a
# pyenv or conda Python beside a Debian libpython3.x) and then finds none of its packages: "No module named
# 'ferry.common'". This is the LD_LIBRARY_PATH the user had before R started, for the relay's process.
.ferry_library_path_without_r <- function(value = Sys.getenv("LD_LIBRARY_PATH")) {
  parts <- strsplit(value, ":", fixed = TRUE)[[1]]
  same <- function(a, b) identical(normalizePath(a, mustWork = FALSE), normalizePath(b, mustWork = FALSE))
  if (length(parts) == 0 || !same(parts[1], R.home("lib"))) return(value)  # not R's launcher's doing
  parts <- parts[-1]
  if (length(parts) > 0 && grepl("^/usr/lib(64|/[^/]*-linux-gnu[^/]*)?/?$", parts[1])) parts <- parts[-1]
  if (length(parts) > 0 && grepl("/lib/server/?$", parts[1])) parts <- parts[-1]  # R_JAVA_LD_LIBRARY_PATH
  paste(parts, collapse = ":")
}

# --- the protocol ---------------------------------------------------------------------------------------------

.ferry_open <- function(loader) {
  if (is.null(loader$con)) stop("ferry: this loader is closed")
}

.ferry_start <- function(loader) {
  reply <- .ferry_command(loader, "iter")
  loader$pass <- as.integer(reply$fields$pass)
  loader$consumed <- 0L
  loader$active <- TRUE
  loader$length <- as.integer(reply$fields$length)
  loader$epoch <- as.integer(reply$fields$epoch)
  keep <- vapply(loader$queue, function(m) identical(m$fields$pass, as.character(loader$pass)), logical(1))
  loader$queue <- loader$queue[keep]
  list(epoch = loader$epoch, first = as.integer(reply$fields$first), length = loader$length)
}

.ferry_pass_length <- function(loader) if (is.null(loader$length)) -1L else loader$length

.ferry_consumed <- function(loader) {
  loader$consumed <- loader$consumed + 1L
  .ferry_send(loader, "credit", list(n = 1L, pass = loader$pass))
}

.ferry_next_item <- function(loader) {
  repeat {
    if (length(loader$queue) > 0L) {
      item <- loader$queue[[1]]
      loader$queue <- loader$queue[-1]
    } else {
      item <- .ferry_read(loader)
    }
    if (item$type %in% c("batch", "error", "end")) {
      if (identical(item$fields$pass, as.character(loader$pass))) return(item)
    } else if (item$type != "ping") {
      stop("ferry: the relay sent ", item$type, " where a batch was due")
    }
  }
}

.ferry_command <- function(loader, type, fields = list(), texts = list()) {
  .ferry_open(loader)
  .ferry_send(loader, type, fields, texts)
  repeat {
    message <- .ferry_read(loader)
    if (!is.null(message$fields$reply)) {
      if (message$type == "error") stop(.ferry_error(message))
      return(message)
    }
    if (message$type != "ping") loader$queue <- c(loader$queue, list(message))
  }
}

.ferry_send <- function(loader, type, fields = list(), texts = list()) {
  lines <- c(type, if (length(fields)) paste(names(fields), vapply(fields, as.character, "")))
  bodies <- lapply(texts, function(t) charToRaw(enc2utf8(t)))
  lines <- c(lines, if (length(texts)) paste("text", names(texts), vapply(bodies, length, 1L)))
  header <- charToRaw(enc2utf8(paste(lines, collapse = "\n")))
  writeBin(c(writeBin(length(header), raw(), size = 4L, endian = "big"), header, unlist(bodies, use.names = FALSE)),
           loader$con)
  flush(loader$con)
}

.ferry_exact <- function(con, n) {
  if (n == 0L) return(raw(0))
  got <- readBin(con, "raw", n)
  while (length(got) < n) {  # a short read: the relay closed, or said nothing within the timeout
    more <- readBin(con, "raw", n - length(got))
    if (length(more) == 0L) {
      stop(.ferry_condition("the relay closed the connection, or sent nothing within the timeout",
                            c("connection_lost", "RelayError")))
    }
    got <- c(got, more)
  }
  got
}

# a message: its type, fields (a named list of strings), parts (in order), texts and raws (by name); the arrays of
# an inline batch are read too; a batch whose arrays lie in a payload file keeps them there until it is consumed
.ferry_read <- function(loader) {
  con <- loader$con
  n <- readBin(con, "integer", 1L, size = 4L, endian = "big")
  if (length(n) == 0L) {
    stop(.ferry_condition("the relay closed the connection, or sent nothing within the timeout",
                          c("connection_lost", "RelayError")))
  }
  message <- .ferry_parse_header(rawToChar(.ferry_exact(con, n)))
  message$texts <- list()
  message$raws <- list()
  message$arrays <- list()
  in_file <- !is.null(message$fields$file)
  for (part in message$parts) {
    if (part$kind == "text") {
      text <- rawToChar(.ferry_exact(con, part$nbytes))
      Encoding(text) <- "UTF-8"
      message$texts[[part$name]] <- text
    } else if (part$kind == "raw") {
      message$raws[[part$name]] <- .ferry_exact(con, part$nbytes)
    } else if (part$kind == "array" && !in_file) {
      message$arrays[[part$name]] <- .ferry_read_array(con, part)
    }
  }
  message
}

.ferry_parse_header <- function(text) {
  lines <- strsplit(text, "\n", fixed = TRUE)[[1]]
  message <- list(type = lines[1], fields = list(), parts = list())
  for (line in lines[-1]) {
    key <- sub(" .*$", "", line)
    value <- if (grepl(" ", line, fixed = TRUE)) sub("^[^ ]* ", "", line) else ""
    if (key %in% c("array", "text", "raw", "null")) {
      words <- strsplit(value, " ", fixed = TRUE)[[1]]
      part <- list(kind = key, name = words[1])
      if (key == "array") {
        part$dtype <- words[2]
        part$dims <- if (words[3] == "-") integer(0) else as.integer(strsplit(words[3], ",", fixed = TRUE)[[1]])
      } else if (key != "null") {
        part$nbytes <- as.integer(words[2])
      }
      message$parts[[length(message$parts) + 1L]] <- part
    } else {
      message$fields[[key]] <- value
    }
  }
  message
}

.FERRY_SIZES <- c(float64 = 8L, float32 = 4L, float16 = 2L, int64 = 8L, int32 = 4L, uint32 = 4L, int16 = 2L,
                  uint16 = 2L, int8 = 1L, uint8 = 1L, bool = 1L)

# one array, from a connection positioned at its bytes: R's column-major order, so dims apply as they are
.ferry_read_array <- function(con, part) {
  n <- prod(part$dims)
  size <- .FERRY_SIZES[[part$dtype]]
  v <- switch(part$dtype,
    float64 = , float32 = readBin(con, "double", n, size = size, endian = "little"),
    int32 = readBin(con, "integer", n, size = 4L, endian = "little"),
    int16 = , int8 = readBin(con, "integer", n, size = size, endian = "little", signed = TRUE),
    uint16 = readBin(con, "integer", n, size = 2L, endian = "little", signed = FALSE),
    uint8 = as.integer(readBin(con, "raw", n)),
    bool = as.logical(readBin(con, "raw", n)),
    stop("ferry: this client cannot read dtype ", part$dtype, " (it asks the relay for ", .FERRY_DTYPES, ")"))
  if (length(v) != n) {
    stop(.ferry_condition(sprintf("array %s came short: %d of %d values", part$name, length(v), n),
                          c("connection_lost", "RelayError")))
  }
  if (length(part$dims) >= 2L) dim(v) <- part$dims
  v
}

# a batch message as the batch: arrays, strings, raws and NULLs in lists, named where Python had dict keys
.ferry_batch <- function(loader, item) {
  if (!is.null(item$fields$file)) {
    path <- file.path(loader$folder, item$fields$file)
    f <- file(path, "rb")
    on.exit(close(f))
    for (part in item$parts) {
      if (part$kind == "array") item$arrays[[part$name]] <- .ferry_read_array(f, part)
    }
  }
  values <- lapply(item$parts, function(part) {
    switch(part$kind, array = item$arrays[[part$name]], text = item$texts[[part$name]],
           raw = item$raws[[part$name]], null = NULL)
  })
  paths <- lapply(item$parts, function(part) .ferry_path(part$name))
  .ferry_nest(paths, values)
}

.ferry_path <- function(name) {
  if (name == ".") return(character(0))
  strsplit(name, "/", fixed = TRUE)[[1]]
}

.ferry_nest <- function(paths, values) {
  if (length(paths) == 1L && length(paths[[1]]) == 0L) return(values[[1]])
  heads <- vapply(paths, function(p) p[1], "")
  keys <- unique(heads)
  out <- lapply(keys, function(key) {
    at <- which(heads == key)
    .ferry_nest(lapply(paths[at], function(p) p[-1]), values[at])
  })
  positional <- startsWith(keys, "#")
  if (all(positional)) {
    out[order(as.integer(substring(keys, 2L)))]
  } else {
    names(out) <- ifelse(positional, keys, vapply(keys, utils::URLdecode, ""))
    out
  }
}

.ferry_error <- function(message) {
  classes <- strsplit(if (is.null(message$fields$classes)) "" else message$fields$classes, ",", fixed = TRUE)[[1]]
  text <- paste0(message$fields$class, ": ", message$texts$message)
  condition <- .ferry_condition(text, classes)
  condition$traceback <- message$texts$traceback
  condition$index <- if (is.null(message$fields$index)) NA_integer_ else as.integer(message$fields$index)
  condition$consumed <- identical(message$fields$consumed, "1")
  condition
}

.ferry_condition <- function(text, classes) {
  structure(class = c(paste0("ferry_", classes), "ferry_error", "error", "condition"),
            list(message = text, call = NULL))
}

.ferry_read_connection_file <- function(path) {
  lines <- readLines(path, warn = FALSE)
  if (length(lines) == 0L || lines[1] != "ferry-relay") stop("ferry: ", path, " is not a relay connection file")
  lines <- lines[-1]
  lines <- lines[nzchar(lines)]
  values <- sub("^[^ ]* ", "", lines)
  names(values) <- sub(" .*$", "", lines)
  as.list(values)
}

# coro's generic, where coro is installed (it is not needed otherwise): when the package loads, or when this file
# is sourced
.ferry_register_coro <- function() {
  if (requireNamespace("coro", quietly = TRUE)) {
    registerS3method("as_iterator", "ferry_loader", as_iterator.ferry_loader, envir = asNamespace("coro"))
  }
}
.onLoad <- function(libname, pkgname) .ferry_register_coro()
if (identical(environment(), globalenv())) .ferry_register_coro()
