# gateway/embed.cmake: writes OUT, a C file defining `const char NAME[]` (NUL-terminated) and
# `const size_t NAME_len` with the bytes of IN, including HEADER. Run by the build:
#   cmake -DIN=file -DOUT=file.c -DNAME=symbol -DHEADER=dir/header.h -P embed.cmake
file(READ "${IN}" hex HEX)
string(LENGTH "${hex}" digits)
math(EXPR bytes "${digits} / 2")
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," body "${hex}")
string(REGEX REPLACE "((0x[0-9a-f][0-9a-f],){16})" "\\1\n    " body "${body}")
get_filename_component(name "${IN}" NAME)
file(WRITE "${OUT}" "/* ${name}, embedded by gateway/embed.cmake at build time: do not edit. */\n"
     "#include \"${HEADER}\"\n\nconst char ${NAME}[] = {\n    ${body}0x00};\n"
     "const size_t ${NAME}_len = ${bytes};\n")
