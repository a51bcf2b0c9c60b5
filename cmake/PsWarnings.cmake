# ps_set_warnings(target): the project's warning set on one target. With
# PS_THREAD_SAFETY (clang only) also clang's lock analysis, as an error:
# every GUARDED_BY member read or written without its lock (src/van/sync.h).
function(ps_set_warnings target)
  # -Wshadow=local is GCC's; clang (the fuzz build) spells it differently.
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wnon-virtual-dtor
      -Wno-unused-parameter>
    $<$<COMPILE_LANG_AND_ID:CXX,GNU>:-Wshadow=local>
    $<$<COMPILE_LANG_AND_ID:CXX,Clang>:-Wshadow-uncaptured-local>)
  if(PS_WERROR)
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Werror>)
  endif()
  if(PS_THREAD_SAFETY)
    target_compile_options(${target} PRIVATE
      $<$<COMPILE_LANGUAGE:CXX>:-Wthread-safety -Wthread-safety-beta
        -Werror=thread-safety -Werror=thread-safety-beta>)
  endif()
endfunction()
