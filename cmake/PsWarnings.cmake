# ps_set_warnings(target): the project's warning set on one target. With
# PS_THREAD_SAFETY (clang only) also clang's lock analysis, as an error:
# every GUARDED_BY member read or written without its lock (src/van/sync.h).
function(ps_set_warnings target)
  # GCC's -Wshadow=local; clang spells the same check (a local that hides
  # another local, lambda captures included) -Wshadow-uncaptured-local.
  if(CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    set(shadow -Wshadow-uncaptured-local)
  else()
    set(shadow -Wshadow=local)
  endif()
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic ${shadow}
      -Wnon-virtual-dtor -Wno-unused-parameter>)
  if(PS_WERROR)
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Werror>)
  endif()
  if(PS_THREAD_SAFETY)
    target_compile_options(${target} PRIVATE
      $<$<COMPILE_LANGUAGE:CXX>:-Wthread-safety -Wthread-safety-beta
        -Werror=thread-safety -Werror=thread-safety-beta>)
  endif()
endfunction()
