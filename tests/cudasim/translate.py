#!/usr/bin/env python3
"""Rewrites a .cu file for the CUDA simulator (tests/cudasim/cudasim.h): each launch
`kernel<<<grid, block[, smem[, stream]]>>>(args)` becomes
`cudasim::launch("kernel", grid, block, smem, stream, kernel, args)`; everything else is kept,
line for line (a #line directive names the original file, so errors and sanitizer reports point
into kernels/cuda/).

    translate.py IN.cu OUT.cc
"""
import sys


def split_top(text):
    """Splits at the commas outside (), [] and {}."""
    parts, depth, cur = [], 0, []
    for ch in text:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur).strip())
    return parts


def kernel_start(src, end):
    """The start of the kernel expression ending before src[end] (a name, maybe ::-qualified,
    maybe with template arguments)."""
    i = end
    while i > 0 and src[i - 1].isspace():
        i -= 1
    if src[i - 1] == ">":   # template arguments: back to the matching <
        depth = 0
        while True:
            i -= 1
            if src[i] == ">":
                depth += 1
            elif src[i] == "<":
                depth -= 1
                if depth == 0:
                    break
    while i > 0 and (src[i - 1].isalnum() or src[i - 1] in "_:"):
        i -= 1
    return i


def matching(src, open_at):
    """The index of the parenthesis closing the one at open_at."""
    depth = 0
    for j in range(open_at, len(src)):
        if src[j] == "(":
            depth += 1
        elif src[j] == ")":
            depth -= 1
            if depth == 0:
                return j
    raise SystemExit("translate.py: unbalanced parentheses after a launch")


def translate(src):
    out, pos, count = [], 0, 0
    while True:
        at = src.find("<<<", pos)
        if at < 0:
            out.append(src[pos:])
            return "".join(out), count
        start = kernel_start(src, at)
        kernel = src[start:at].strip()
        close = src.find(">>>", at)
        cfg = split_top(src[at + 3:close])
        if not 2 <= len(cfg) <= 4:
            raise SystemExit("translate.py: a launch configuration of %d parts" % len(cfg))
        cfg += ["0", "nullptr"][len(cfg) - 2:]
        paren = close + 3
        while src[paren].isspace():
            paren += 1
        if src[paren] != "(":
            raise SystemExit("translate.py: no argument list after >>>")
        end = matching(src, paren)
        args = src[paren + 1:end]
        name = kernel.split("<")[0].strip()
        head = 'cudasim::launch("%s", dim3(%s), dim3(%s), (size_t)(%s), %s, %s' % (
            name, cfg[0], cfg[1], cfg[2], cfg[3], kernel)
        # keep the line count: newlines dropped from the head go after the call
        lost = src[start:paren].count("\n")
        out.append(src[pos:start])
        out.append(head + (", " + args if args.strip() else "") + ")" + "\n" * lost)
        pos = end + 1
        count += 1


def main():
    src_path, out_path = sys.argv[1], sys.argv[2]
    with open(src_path) as f:
        src = f.read()
    text, _ = translate(src)
    with open(out_path, "w") as f:
        f.write('#line 1 "%s"\n' % src_path)
        f.write(text)


if __name__ == "__main__":
    main()
