/* The two per-scrape loops over numbers, compiled: the layout fast path's split and the store's encoding of a
 * histogram's counts. Optional: collect/layout.py and store/counts.py fall back to Python when this module was not
 * built, or when TUNER_PURE_PYTHON is set.
 *
 * A body is split at its line-final numbers exactly as the regex r" ([-+0-9.eE]+)(?:\n|$)" splits it: a number
 * is the text after a line's last space when that text is not empty and made only of "-+0123456789.eE"; the
 * pieces are what lies between the numbers (the space before a number and the newline after it belong to no
 * piece). tests/collect/test_numbers.py holds this equal to the regex on every recorded exposition, the fuzz
 * corpus and generated text.
 *
 *   scan(text) -> (shape, pieces, numbers)
 *       shape: a 64-bit hash of the pieces (where one ends and the next begins is hashed too);
 *       pieces: how many pieces there are (numbers + 1);
 *       numbers: the numbers as floats (float(token) + 0.0, so "-0" is 0.0), or None when one is not a
 *                float literal ("1e", "+-1") or overflows to +-inf.
 *   split(text) -> (pieces, tokens): the same split as lists of str, for tests.
 *   encode_counts(counts) -> str or None: a histogram row's bucket counts as store/counts.py writes them; None
 *       where they are not all whole numbers below 2^53 (the caller writes JSON then).
 *
 * A str that cannot be encoded as UTF-8 (a lone surrogate) raises UnicodeEncodeError.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#define HASH_SEED 0xcbf29ce484222325ULL
#define HASH_PRIME 0x9e3779b97f4a7c15ULL

static const unsigned char NUMBER_CHAR[256] = {
    ['0'] = 1, ['1'] = 1, ['2'] = 1, ['3'] = 1, ['4'] = 1, ['5'] = 1, ['6'] = 1, ['7'] = 1, ['8'] = 1,
    ['9'] = 1, ['-'] = 1, ['+'] = 1, ['.'] = 1, ['e'] = 1, ['E'] = 1,
};

/* Where the number of line [start, end) begins, or -1 when the line does not end in one. */
static Py_ssize_t number_start(const char *s, Py_ssize_t start, Py_ssize_t end) {
    Py_ssize_t i = end;
    while (i > start && NUMBER_CHAR[(unsigned char)s[i - 1]])
        i--;
    if (i == end || i == start || s[i - 1] != ' ')
        return -1;
    return i;
}

static const double POW10[] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,  1e8,  1e9,  1e10, 1e11,
                                1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

/* float(token) for the common spellings, without the general algorithm: a decimal mantissa below 2^53 times or
 * divided by an exactly representable power of ten (10^0..10^22) is one IEEE operation on exact operands, so it
 * is correctly rounded, which is what float() gives (Clinger's fast path). Returns 0 when it does not apply
 * ("1.7952445989416175e+09": 17 digits) or the token is not a literal at all: the caller asks CPython. */
static int fast_double(const char *p, const char *end, double *out) {
    int negative = 0, digits = 0, fraction = 0, too_long = 0;
    uint64_t m = 0;
    if (p < end && (*p == '-' || *p == '+'))
        negative = *p++ == '-';
    for (; p < end && *p >= '0' && *p <= '9'; p++, digits++) {
        if (m >= (1ULL << 49)) /* one more digit could reach 2^53 */
            too_long = 1;
        else
            m = m * 10 + (uint64_t)(*p - '0');
    }
    if (p < end && *p == '.')
        for (p++; p < end && *p >= '0' && *p <= '9'; p++, digits++, fraction++) {
            if (m >= (1ULL << 49))
                too_long = 1;
            else
                m = m * 10 + (uint64_t)(*p - '0');
        }
    if (digits == 0 || too_long)
        return 0;
    int exponent = 0;
    if (p < end && (*p == 'e' || *p == 'E')) {
        int negative_exponent = 0, exponent_digits = 0;
        p++;
        if (p < end && (*p == '-' || *p == '+'))
            negative_exponent = *p++ == '-';
        for (; p < end && *p >= '0' && *p <= '9'; p++, exponent_digits++)
            if (exponent < 1000)
                exponent = exponent * 10 + (*p - '0');
        if (exponent_digits == 0)
            return 0;
        if (negative_exponent)
            exponent = -exponent;
    }
    if (p != end)
        return 0;
    int scale = exponent - fraction;
    double x = (double)m;
    if (scale > 0 && scale <= 22)
        x *= POW10[scale];
    else if (scale < 0 && scale >= -22)
        x /= POW10[-scale];
    else if (scale != 0 && m != 0)
        return 0;
    *out = negative ? -x : x;
    return 1;
}

typedef int (*on_number)(void *ctx, const char *s, Py_ssize_t piece_start, Py_ssize_t piece_end,
                         Py_ssize_t number_start, Py_ssize_t number_end);

/* Calls visit for each number with the piece before it; returns the start of the last piece, or -1 on error. */
static Py_ssize_t walk(const char *s, Py_ssize_t n, on_number visit, void *ctx) {
    Py_ssize_t pos = 0, piece = 0;
    while (pos < n) {
        const char *eol = memchr(s + pos, '\n', (size_t)(n - pos));
        Py_ssize_t end = eol ? (Py_ssize_t)(eol - s) : n;
        Py_ssize_t at = number_start(s, pos, end);
        if (at >= 0) {
            if (visit(ctx, s, piece, at - 1, at, end) < 0)
                return -1;
            piece = eol ? end + 1 : n;
        }
        pos = eol ? end + 1 : n;
    }
    return piece;
}

typedef struct {
    uint64_t hash;
    Py_ssize_t pieces;
    PyObject *numbers; /* a list, or NULL once one number failed */
} scan_ctx;

/* The pieces' hash, 8 bytes at a step: a word is mixed in by xor, multiply and shift; a piece's last (short)
 * word carries its length in its top byte, so where a piece ends changes the hash. */
static inline uint64_t mix(uint64_t h, uint64_t w) {
    h = (h ^ w) * HASH_PRIME;
    return h ^ (h >> 29);
}

static inline uint64_t hash_piece(uint64_t h, const char *s, Py_ssize_t start, Py_ssize_t end) {
    Py_ssize_t i = start;
    uint64_t w;
    for (; end - i >= 8; i += 8) {
        memcpy(&w, s + i, 8);
        h = mix(h, w);
    }
    w = 0;
    memcpy(&w, s + i, (size_t)(end - i));
    return mix(h, w ^ ((uint64_t)(end - i + 1) << 56));
}

static int scan_number(void *p, const char *s, Py_ssize_t ps, Py_ssize_t pe, Py_ssize_t ns, Py_ssize_t ne) {
    scan_ctx *ctx = p;
    ctx->hash = hash_piece(ctx->hash, s, ps, pe);
    ctx->pieces++;
    if (ctx->numbers == NULL)
        return 0;
    double x;
    if (!fast_double(s + ns, s + ne, &x)) {
        char *stop = NULL;
        x = PyOS_string_to_double(s + ns, &stop, NULL); /* stops at the newline (or the final NUL) */
        if (x == -1.0 && PyErr_Occurred()) {
            if (!PyErr_ExceptionMatches(PyExc_ValueError))
                return -1;
            PyErr_Clear();
            Py_CLEAR(ctx->numbers);
            return 0;
        }
        if (stop != s + ne || !isfinite(x)) {
            Py_CLEAR(ctx->numbers);
            return 0;
        }
    }
    PyObject *f = PyFloat_FromDouble(x + 0.0);
    if (f == NULL)
        return -1;
    int rc = PyList_Append(ctx->numbers, f);
    Py_DECREF(f);
    return rc;
}

/* The UTF-8 bytes of str ``text`` (no copy for an ASCII str), or NULL with an exception set. */
static const char *utf8_of(const char *function, PyObject *text, Py_ssize_t *n) {
    if (!PyUnicode_Check(text)) {
        PyErr_Format(PyExc_TypeError, "%s() takes a str", function);
        return NULL;
    }
    return PyUnicode_AsUTF8AndSize(text, n);
}

static PyObject *scan(PyObject *module, PyObject *text) {
    (void)module;
    Py_ssize_t n;
    const char *s = utf8_of("scan", text, &n);
    if (s == NULL)
        return NULL;
    scan_ctx ctx = {HASH_SEED, 0, PyList_New(0)};
    if (ctx.numbers == NULL)
        return NULL;
    Py_ssize_t last = walk(s, n, scan_number, &ctx);
    if (last < 0) {
        Py_XDECREF(ctx.numbers);
        return NULL;
    }
    ctx.hash = hash_piece(ctx.hash, s, last, n);
    ctx.pieces++;
    PyObject *numbers = ctx.numbers ? ctx.numbers : Py_NewRef(Py_None);
    return Py_BuildValue("(KnN)", (unsigned long long)ctx.hash, ctx.pieces, numbers);
}

typedef struct {
    PyObject *pieces, *tokens;
} split_ctx;

/* Appends s[start:end] to ``list`` as a str; -1 on error. */
static int append_text(PyObject *list, const char *s, Py_ssize_t start, Py_ssize_t end) {
    PyObject *text = PyUnicode_DecodeUTF8(s + start, end - start, "strict");
    if (text == NULL)
        return -1;
    int rc = PyList_Append(list, text);
    Py_DECREF(text);
    return rc;
}

static int split_number(void *p, const char *s, Py_ssize_t ps, Py_ssize_t pe, Py_ssize_t ns, Py_ssize_t ne) {
    split_ctx *ctx = p;
    return append_text(ctx->pieces, s, ps, pe) < 0 ? -1 : append_text(ctx->tokens, s, ns, ne);
}

static PyObject *split(PyObject *module, PyObject *text) {
    (void)module;
    Py_ssize_t n;
    const char *s = utf8_of("split", text, &n);
    if (s == NULL)
        return NULL;
    split_ctx ctx = {PyList_New(0), PyList_New(0)};
    if (ctx.pieces == NULL || ctx.tokens == NULL)
        goto fail;
    Py_ssize_t last = walk(s, n, split_number, &ctx);
    if (last < 0)
        goto fail;
    if (append_text(ctx.pieces, s, last, n) < 0)
        goto fail;
    return Py_BuildValue("(NN)", ctx.pieces, ctx.tokens);
fail:
    Py_XDECREF(ctx.pieces);
    Py_XDECREF(ctx.tokens);
    return NULL;
}

/* encode_counts(counts) -> str or None: a histogram row's bucket counts as store/counts.py writes them (the
 * increments from bucket to bucket, in decimal, trailing zeros left out: "0,0,3,8,2"), or None where they are
 * not all whole numbers below 2^53 (the caller writes JSON then). */
static PyObject *encode_counts(PyObject *module, PyObject *counts) {
    (void)module;
    PyObject *seq = PySequence_Fast(counts, "encode_counts() takes a sequence of floats");
    if (seq == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    char stack[512];
    char *buf = stack;
    size_t size = sizeof stack, len = 0, kept = 0; /* kept: the length up to the last non-zero increment */
    int64_t previous = 0;
    PyObject *result = NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        double x = PyFloat_AsDouble(items[i]);
        if (x == -1.0 && PyErr_Occurred())
            goto done;
        if (!(fabs(x) < 9007199254740992.0) || x != (double)(int64_t)x) { /* NaN, Inf, a fraction, 2^53 up */
            result = Py_NewRef(Py_None);
            goto done;
        }
        int64_t whole = (int64_t)x, step = whole - previous;
        previous = whole;
        if (len + 24 > size) {
            size_t bigger = size * 2;
            char *grown = buf == stack ? PyMem_Malloc(bigger) : PyMem_Realloc(buf, bigger);
            if (grown == NULL) {
                PyErr_NoMemory();
                goto done;
            }
            if (buf == stack)
                memcpy(grown, stack, len);
            buf = grown;
            size = bigger;
        }
        len += (size_t)snprintf(buf + len, size - len, i ? ",%lld" : "%lld", (long long)step);
        if (step)
            kept = len;
    }
    result = PyUnicode_FromStringAndSize(buf, (Py_ssize_t)kept);
done:
    if (buf != stack)
        PyMem_Free(buf);
    Py_DECREF(seq);
    return result;
}

static PyMethodDef methods[] = {
    {"scan", scan, METH_O, "scan(text) -> (shape, pieces, numbers or None): the layout fast path's split."},
    {"split", split, METH_O, "split(text) -> (pieces, tokens): the same split as lists of str."},
    {"encode_counts", encode_counts, METH_O, "encode_counts(counts) -> str or None: store/counts.py's format."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_numbers", "The layout fast path's split, compiled.", -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__numbers(void) { return PyModule_Create(&module); }
